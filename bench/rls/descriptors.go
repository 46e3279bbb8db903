package main

import (
	"fmt"
	"strconv"
	"strings"
)

// The descriptors a run sends, written as the -entries flag takes them:
// descriptors separated by "|", the entries of one descriptor by ";", each
// entry key=value. In a value, {i} is the request's key index (0 to
// -keys - 1) and {ip} an IPv4 address made from it, 10.0.<i/256>.<i%256>
// (only a string in the request: nothing is sent to it).
const (
	entries1 = "tenant=bench-{i}"
	entries3 = "tenant=bench-{i}|tenant=bench-{i};generic_key=search|remote_address={ip}"
)

// An entry is one key and value of a descriptor, its value a template.
type entry struct{ key, value string }

// A pattern is the descriptors of one request, before the key index is
// put into them.
type pattern [][]entry

// parsePattern reads the -entries syntax.
func parsePattern(s string) (pattern, error) {
	var p pattern
	for d := range strings.SplitSeq(s, "|") {
		var desc []entry
		for e := range strings.SplitSeq(d, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(e), "=")
			if !ok || k == "" || v == "" {
				return nil, fmt.Errorf("entries: %q: want key=value", e)
			}
			desc = append(desc, entry{k, v})
		}
		p = append(p, desc)
	}
	return p, nil
}

// defaultPattern is the fixed scheme for 1 and 3 descriptors.
func defaultPattern(descriptors int) (pattern, error) {
	switch descriptors {
	case 1:
		return parsePattern(entries1)
	case 3:
		return parsePattern(entries3)
	}
	return nil, fmt.Errorf("descriptors: %d: want 1 or 3, or give -entries", descriptors)
}

// expand is descriptor d of the pattern for key index i, as entries.
func (p pattern) expand(d, i int) []entry {
	out := make([]entry, len(p[d]))
	for j, e := range p[d] {
		v := strings.ReplaceAll(e.value, "{i}", strconv.Itoa(i))
		v = strings.ReplaceAll(v, "{ip}", fmt.Sprintf("10.0.%d.%d", i/256%256, i%256))
		out[j] = entry{e.key, v}
	}
	return out
}

func (p pattern) String() string {
	ds := make([]string, len(p))
	for d, desc := range p {
		es := make([]string, len(desc))
		for j, e := range desc {
			es[j] = e.key + "=" + e.value
		}
		ds[d] = strings.Join(es, ";")
	}
	return strings.Join(ds, "|")
}
