package ledger

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the migrations of a dialect ("postgres" or "sqlite"),
// in version order. A migration's file is named NNN_description.sql.
func migrations(dialect string) ([]migration, error) {
	dir := "migrations/" + dialect
	names, err := fs.Glob(migrationFS, dir+"/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, n := range names {
		base := n[len(dir)+1:]
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("ledger: migration %s: name must be NNN_description.sql", n)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := range ms {
		if ms[i].version != i+1 {
			return nil, fmt.Errorf("ledger: migrations of %s: %s is out of sequence", dialect, ms[i].name)
		}
	}
	return ms, nil
}
