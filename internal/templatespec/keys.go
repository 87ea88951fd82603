package templatespec

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"space/internal/errkind"
)

// Keys are the cache keys of a build: Base identifies the first layer;
// Steps[i] identifies the file system after step i. Each key covers
// everything before it, so a build whose first k keys match a cached one
// can start from that cache's layer k: same base and steps, no rebuild;
// step 3 changed, steps 1-2 reused.
type Keys struct {
	Base  string
	Steps []string
}

// keyVersion changes when what a key covers changes, so old caches miss.
const keyVersion = "space-template-keys-1"

// CacheKeys computes s's keys, reading the build context contextDir: the
// content of local bases and of every copied file goes into the keys, so
// editing a copied file invalidates the step that copies it and those
// after. What the spec cannot pin is not in them: the current contents of
// a registry tag, the Debian archive's packages, or what a run step
// downloads (a build with no cache refreshes those).
func CacheKeys(s *Spec, contextDir string) (Keys, error) {
	h := sha256.New()
	io.WriteString(h, keyVersion)
	writeJSON(h, s.Base)
	if local := s.Base.LocalPath(); local != "" {
		if err := hashContextPath(h, contextDir, local); err != nil {
			return Keys{}, fmt.Errorf("base: %w", err)
		}
	}
	k := Keys{Base: hex.EncodeToString(h.Sum(nil))}
	prev := k.Base
	for i, st := range s.Steps {
		h := sha256.New()
		io.WriteString(h, prev)
		writeJSON(h, st)
		if st.Copy != nil {
			if err := hashContextPath(h, contextDir, st.Copy.Src); err != nil {
				return Keys{}, fmt.Errorf("steps[%d].copy: %w", i, err)
			}
		}
		prev = hex.EncodeToString(h.Sum(nil))
		k.Steps = append(k.Steps, prev)
	}
	return k, nil
}

// writeJSON writes v's canonical JSON (maps are sorted by encoding/json).
func writeJSON(h hash.Hash, v any) {
	b, _ := json.Marshal(v)
	h.Write(b)
	h.Write([]byte{0})
}

// hashContextPath hashes the tree at rel in contextDir: every entry's
// relative path, type, permission bits, and content (a regular file's
// bytes, a symlink's target), in lexical order. It refuses a path that
// resolves outside the context.
func hashContextPath(h hash.Hash, contextDir, rel string) error {
	root, err := filepath.Abs(contextDir)
	if err != nil {
		return err
	}
	p := filepath.Join(root, filepath.FromSlash(rel))
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, errors.Join(err, errkind.InvalidArgument))
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return err
	}
	if real != realRoot && !strings.HasPrefix(real, realRoot+string(filepath.Separator)) {
		return fmt.Errorf("%s leads outside the build context: %w", rel, errkind.InvalidArgument)
	}
	var paths []string
	err = filepath.WalkDir(real, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, q)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	sort.Strings(paths)
	for _, q := range paths {
		if err := hashEntry(h, real, q); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	return nil
}

func hashEntry(h hash.Hash, root, p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	r, err := filepath.Rel(root, p)
	if err != nil {
		return err
	}
	var hdr [12]byte
	binary.BigEndian.PutUint32(hdr[0:], uint32(fi.Mode().Type()>>24))
	binary.BigEndian.PutUint32(hdr[4:], uint32(fi.Mode().Perm()))
	binary.BigEndian.PutUint32(hdr[8:], uint32(len(r)))
	h.Write(hdr[:])
	io.WriteString(h, filepath.ToSlash(r))
	switch {
	case fi.Mode().IsRegular():
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(fi.Size()))
		h.Write(n[:])
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		io.WriteString(h, target)
		h.Write([]byte{0})
	case fi.IsDir():
	default:
		return fmt.Errorf("%s: %v files cannot be copied into a template: %w", r, fi.Mode().Type(), errkind.InvalidArgument)
	}
	return nil
}
