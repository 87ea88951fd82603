package client

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"space/internal/templatespec"
)

// PackContext opens the build context of the template spec at specFile
// for BuildTemplate, and returns the options that name the spec file in
// it. The context is the spec file's directory, but the stream holds only
// what the build reads: the spec file, each copy step's src (a file or a
// whole tree) and a local base (base.dir, or base.oci when it is a path).
// Entries are files, directories and symbolic links (packed as links, not
// followed) with their modes and owners. A link on the way to one of
// those paths is packed as a relative link, with what it leads to.
//
// A spec that does not check, or a path that does not exist or leads
// outside the directory, is an error here; a file that cannot be packed
// (a socket, say) fails the stream's Read. The stream is written while it
// is read; the caller must Close it.
func PackContext(specFile string) (io.ReadCloser, BuildOptions, error) {
	spec, err := os.ReadFile(specFile)
	if err != nil {
		return nil, BuildOptions{}, err
	}
	sp, err := templatespec.Parse(bytes.NewReader(spec))
	if err != nil {
		return nil, BuildOptions{}, fmt.Errorf("%s: %w", specFile, err)
	}
	specInfo, err := os.Stat(specFile)
	if err != nil {
		return nil, BuildOptions{}, err
	}
	dir, err := filepath.Abs(filepath.Dir(specFile))
	if err != nil {
		return nil, BuildOptions{}, err
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, BuildOptions{}, err
	}
	file := filepath.Base(specFile)
	p := &packer{root: root, spec: spec, specName: file, specInfo: specInfo, written: map[string]bool{}}
	var paths []string
	switch {
	case sp.Base.Dir != "":
		paths = append(paths, sp.Base.Dir)
	case sp.Base.OCI != "" && templatespec.LocalOCI(sp.Base.OCI):
		paths = append(paths, sp.Base.OCI)
	}
	for _, st := range sp.Steps {
		if st.Copy != nil {
			paths = append(paths, st.Copy.Src)
		}
	}
	for _, rel := range paths {
		if err := p.plan(rel); err != nil {
			return nil, BuildOptions{}, fmt.Errorf("build context %s: %w", dir, err)
		}
	}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(p.write(pw))
	}()
	return &packedContext{pr: pr, done: done}, BuildOptions{File: file}, nil
}

// packedContext is a build context being packed by a goroutine that its
// Close waits for.
type packedContext struct {
	pr   *io.PipeReader
	done chan struct{} // closed when the packing goroutine has returned
}

func (c *packedContext) Read(b []byte) (int, error) { return c.pr.Read(b) }

// Close stops the packing and waits for it. It may be called more than
// once, concurrently (an HTTP transport closes a request body too).
func (c *packedContext) Close() error {
	c.pr.Close()
	<-c.done
	return nil
}

// packer packs the paths of a build context.
type packer struct {
	root     string // the context directory: absolute, no symbolic links
	spec     []byte // the spec file's content, packed as a regular file
	specName string
	specInfo fs.FileInfo
	links    []link   // links on the way to trees, in the order found
	trees    []string // slash-separated paths in root, without links
	written  map[string]bool
}

// link is a symbolic link on the way to a packed path.
type link struct {
	name, target string // slash-separated; target relative to name's directory
	fi           fs.FileInfo
}

// plan adds what makes rel (a path in the context, already checked by
// the spec) reachable: the links on the way, as links to where they
// lead, and the tree rel finally names.
func (p *packer) plan(rel string) error {
	rel = path.Clean(rel)
	if _, err := p.resolve(rel); err != nil {
		return err
	}
	for {
		name, rest, fi, err := p.firstLink(rel)
		if err != nil {
			return err
		}
		if name == "" {
			p.trees = append(p.trees, rel)
			return nil
		}
		target, err := p.resolve(name)
		if err != nil {
			return err
		}
		text, err := filepath.Rel(filepath.FromSlash(path.Dir(name)), filepath.FromSlash(target))
		if err != nil {
			return err
		}
		p.links = append(p.links, link{name: name, target: filepath.ToSlash(text), fi: fi})
		rel = path.Join(target, rest)
	}
}

// resolve returns where rel leads, relative to root, following every
// link; one that leads outside root is an error.
func (p *packer) resolve(rel string) (string, error) {
	real, err := filepath.EvalSymlinks(filepath.Join(p.root, filepath.FromSlash(rel)))
	if err != nil {
		return "", err
	}
	r, err := filepath.Rel(p.root, real)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s leads outside the build context (to %s)", rel, real)
	}
	return filepath.ToSlash(r), nil
}

// firstLink finds the first symbolic link among rel and its parents: its
// name, the part of rel after it, and its file info. name is "" when
// there is none.
func (p *packer) firstLink(rel string) (name, rest string, fi fs.FileInfo, err error) {
	if rel == "." {
		return "", "", nil, nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		name := strings.Join(parts[:i+1], "/")
		fi, err := os.Lstat(filepath.Join(p.root, filepath.FromSlash(name)))
		if err != nil {
			return "", "", nil, err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return name, strings.Join(parts[i+1:], "/"), fi, nil
		}
	}
	return "", "", nil, nil
}

// write writes the tar stream: the spec file, the links, then the trees.
// A name is written once.
func (p *packer) write(w io.Writer) error {
	tw := tar.NewWriter(w)
	hdr, err := p.header(p.specName, p.specInfo, "")
	if err != nil {
		return err
	}
	hdr.Size = int64(len(p.spec))
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := tw.Write(p.spec); err != nil {
		return err
	}
	p.written[p.specName] = true
	for _, l := range p.links {
		if err := p.entry(tw, l.name, l.fi, l.target); err != nil {
			return err
		}
	}
	for _, t := range p.trees {
		if err := p.tree(tw, t); err != nil {
			return err
		}
	}
	return tw.Close()
}

// tree writes the tree rel, whose links are packed as links.
func (p *packer) tree(tw *tar.Writer, rel string) error {
	return filepath.WalkDir(filepath.Join(p.root, filepath.FromSlash(rel)), func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name, err := filepath.Rel(p.root, q)
		if err != nil {
			return err
		}
		name = filepath.ToSlash(name)
		if name == "." || p.written[name] {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(q); err != nil {
				return err
			}
		}
		return p.entry(tw, name, fi, target)
	})
}

// entry writes one entry: a regular file with its content, a directory,
// or a link to target.
func (p *packer) entry(tw *tar.Writer, name string, fi fs.FileInfo, target string) error {
	hdr, err := p.header(name, fi, target)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	p.written[name] = true
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(filepath.Join(p.root, filepath.FromSlash(name)))
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: changed while it was packed", name)
		}
		return err
	}
	return nil
}

// header is the tar header of name; only files, directories and links
// can be packed.
func (p *packer) header(name string, fi fs.FileInfo, target string) (*tar.Header, error) {
	switch m := fi.Mode(); {
	case m.IsRegular(), m.IsDir(), m&fs.ModeSymlink != 0:
	default:
		return nil, fmt.Errorf("%s: a %v file cannot be in a build context (only files, directories and symbolic links)", name, m.Type())
	}
	hdr, err := tar.FileInfoHeader(fi, target)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", "" // the server goes by the numeric IDs
	return hdr, nil
}
