// Package atomicfile replaces a file's content whole or not at all: a
// reader, or the next start after a crash, finds the old content or the
// new one, never a part.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Write replaces path's content with data, mode perm: it writes a
// temporary file in path's directory, syncs it, renames it over path and
// syncs the directory, so that the rename survives a crash of the
// machine.
func Write(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, there is nothing to remove
	_, err = f.Write(data)
	if err = errors.Join(err, f.Chmod(perm), f.Sync(), f.Close()); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
