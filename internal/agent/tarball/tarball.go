// Package tarball sends a guest directory to the host as a tar stream and
// receives a tar stream into a guest directory.
//
// Pack walks a directory without following symlinks and writes a PAX tar.
// Unpack extracts a tar into a staging directory through an [os.Root], so no
// entry, not even one reached through a symlink the archive itself created,
// lands outside it. Place then moves the staging directory into its final
// location, merging into an existing directory entry by entry.
//
// Unpack and Place trust an archive only as far as [Options] says. By
// default an archive is hostile input, as one taken out of a sandbox is on
// the host: it cannot set an owner, a setuid, setgid or sticky bit, group or
// other write permission, and it cannot make a fifo or a device node. The
// agent unpacks the sandbox owner's archive in the guest with
// [Options.Privileged], which restores all of that.
package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// maxNameLen bounds entry and hard-link target names accepted by Unpack.
const maxNameLen = 4096

// modeBits are the FileMode bits that chmod sets.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// HostPerm are the permission bits an unprivileged Unpack keeps of an
// archive's mode: no setuid, setgid or sticky bit, and no group or other
// write, so that nothing taken out of a sandbox runs with its owner's
// rights or can be changed by other users of the host.
const HostPerm fs.FileMode = 0o755

// Options says how far Unpack and Place trust an archive. The zero Options
// treat it as hostile.
type Options struct {
	// Privileged restores all the archive says: owners (when running as
	// root; otherwise EPERM from chown is ignored), setuid, setgid and
	// sticky bits, group and other write, and fifos. Only for an archive
	// whose sender may do all of that where it is unpacked anyway: the
	// agent unpacking the sandbox owner's archive in the guest.
	//
	// Without it, every file and directory is owned by the caller, keeps
	// only the HostPerm bits of its archived mode, fifos and device nodes
	// are skipped (counted in Stats.Skipped, with hard links to them), and
	// Place leaves the owners of existing directories it merges into
	// alone.
	Privileged bool
}

// Stats counts what Pack or Unpack transferred.
type Stats struct {
	Entries int   // archive entries of every type
	Bytes   int64 // regular-file content bytes
	Skipped int   // entries an unprivileged Unpack left out (fifos, device nodes, links to them)
}

// Pack writes a PAX tar of dir's contents to w and reports what it wrote.
//
// Entry names are relative to dir ("a/b", directories "a/"); dir itself has
// no entry. Pack keeps directories, regular files, symlinks, hard links,
// fifos and device nodes with their mode, owner and mtime, and skips sockets.
// A file that vanishes during the walk is skipped; a file that changes size
// while it is read is cut or zero-padded to the size its header announced.
// Pack returns an error wrapping [errkind.FailedPrecondition] when dir is not
// a directory, and ctx's error when ctx ends between entries.
//
// A w that is a FileSender sends the content of regular files of at least
// MinSend bytes itself; the archive is the same.
func Pack(ctx context.Context, dir string, w io.Writer) (Stats, error) {
	root, err := packRoot(dir)
	if err != nil {
		return Stats{}, err
	}
	p := &packer{w: w, tw: tar.NewWriter(w), root: root, links: make(map[fileID]string)}
	p.sender, _ = w.(FileSender)
	err = filepath.WalkDir(root, func(name string, _ fs.DirEntry, err error) error {
		return p.visit(ctx, name, err)
	})
	if err != nil {
		return p.stats, err
	}
	if err := p.tw.Close(); err != nil {
		return p.stats, fmt.Errorf("finish archive: %w", err)
	}
	return p.stats, nil
}

// packRoot resolves dir to the real directory Pack walks, so that a dir
// given as a symlink to a directory is walked rather than sent as a link.
func packRoot(dir string) (string, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("pack: %w: %w", err, errkind.FailedPrecondition)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("pack %s: not a directory: %w", dir, errkind.FailedPrecondition)
	}
	return filepath.EvalSymlinks(dir)
}

// fileID identifies an inode, to recognise hard links.
type fileID struct {
	dev, ino uint64
}

// FileSender is a Pack destination that sends the content of a regular
// file itself, in order after what was written to it, rather than Pack
// copying it through Write (the agent sends a file from the guest's page
// cache in place).
type FileSender interface {
	io.Writer
	// SendFile sends the first n bytes of f and returns how many it
	// sent: fewer only when f ended first.
	SendFile(f *os.File, n int64) (int64, error)
}

// MinSend is the least content Pack hands to a FileSender.
const MinSend = 1 << 20

// packer holds the state of one Pack call.
type packer struct {
	w      io.Writer
	sender FileSender // w, if it sends files itself; or nil
	tw     *tar.Writer
	root   string            // the walked directory, symlinks resolved
	links  map[fileID]string // entry name of each multiply linked file already sent
	stats  Stats
}

// visit writes the entry for one walked path.
func (p *packer) visit(ctx context.Context, name string, walkErr error) error {
	if walkErr != nil {
		if errors.Is(walkErr, fs.ErrNotExist) {
			return nil // vanished during the walk
		}
		return walkErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if name == p.root {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(name, &st); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return &fs.PathError{Op: "lstat", Path: name, Err: err}
	}
	rel, err := filepath.Rel(p.root, name)
	if err != nil {
		return err
	}
	hdr := header(filepath.ToSlash(rel), &st)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return nil
	case unix.S_IFREG:
		return p.file(name, hdr, &st)
	case unix.S_IFLNK:
		target, err := os.Readlink(name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		hdr.Linkname = target
	}
	return p.write(hdr)
}

// header describes st in a tar header named name. Regular files get their
// size and data from file.
func header(name string, st *unix.Stat_t) *tar.Header {
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX, // PAX keeps sub-second mtimes and large ids
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case unix.S_IFREG:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor = int64(unix.Major(st.Rdev))
		hdr.Devminor = int64(unix.Minor(st.Rdev))
	}
	return hdr
}

// write writes a header that has no data.
func (p *packer) write(hdr *tar.Header) error {
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	p.stats.Entries++
	return nil
}

// file writes a regular file, or a hard link to the entry that already
// carried its inode.
func (p *packer) file(name string, hdr *tar.Header, st *unix.Stat_t) error {
	id := fileID{dev: st.Dev, ino: st.Ino}
	if st.Nlink > 1 {
		if first, ok := p.links[id]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return p.write(hdr)
		}
	}
	// O_NONBLOCK keeps a fifo swapped in since the Lstat from blocking the open.
	f, err := os.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("pack %s: no longer a regular file", name)
	}
	if p.sender != nil && hdr.Size >= MinSend {
		err = p.send(f, hdr)
	} else if err = p.write(hdr); err == nil {
		err = p.copyData(f, hdr)
	}
	if err != nil {
		return err
	}
	if st.Nlink > 1 {
		p.links[id] = hdr.Name
	}
	p.stats.Bytes += hdr.Size
	return nil
}

// copyData writes exactly hdr.Size bytes of f, padding with zeros when the
// file shrank after its header was made.
func (p *packer) copyData(f *os.File, hdr *tar.Header) error {
	n, err := io.CopyN(p.tw, f, hdr.Size)
	if err == io.EOF {
		_, err = io.CopyN(p.tw, zeroReader{}, hdr.Size-n)
	}
	if err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	return nil
}

// send writes a regular file's entry with its content sent by p.sender:
// the same bytes tar.Writer would write (the header blocks, hdr.Size
// bytes, padding to a block), with zeros for what the file lost since its
// header was made. p.tw is left between entries, as after an entry it
// wrote.
func (p *packer) send(f *os.File, hdr *tar.Header) error {
	// The previous entry's padding, then this header, made by a writer of
	// its own so p.tw expects no content.
	if err := p.tw.Flush(); err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	var head bytes.Buffer
	if err := tar.NewWriter(&head).WriteHeader(hdr); err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	p.stats.Entries++
	if _, err := p.w.Write(head.Bytes()); err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	n, err := p.sender.SendFile(f, hdr.Size)
	if err == nil {
		pad := (blockSize - hdr.Size%blockSize) % blockSize
		_, err = io.CopyN(p.w, zeroReader{}, hdr.Size-n+pad)
	}
	if err != nil {
		return fmt.Errorf("write entry %s: %w", hdr.Name, err)
	}
	return nil
}

// blockSize is tar's block.
const blockSize = 512

// zeroReader is an endless reader of zero bytes.
type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// Unpack extracts the tar read from r into dir, an existing directory, and
// reports what it extracted.
//
// Every entry is created through an [os.Root] on dir, so nothing is written
// outside dir, even through symlinks the archive creates or dir held
// before. Symlinks are created as they are, their targets only text; a
// regular file is created afresh (O_EXCL), never written through an
// existing file or link. Names that are absolute, contain "..", contain NUL
// or are too long, hard links that point outside the archive, entry types
// other than directories, regular files, symlinks, hard links, fifos and
// (when not privileged) device nodes, and (when not privileged) entries and
// hard-link targets below a symlink, even one that stays inside dir, are
// rejected with an error wrapping [errkind.InvalidArgument]. An archive that ends early, including
// one that lacks its end-of-archive marker, gives an error wrapping
// [io.ErrUnexpectedEOF]. Existing files and symlinks are replaced; existing
// directories keep their contents. Modes and mtimes are restored, and
// owners and the rest only as opts allows. Unpack stops reading r after
// the end-of-archive marker, checks ctx between entries, and on error
// leaves what it wrote for the caller to remove.
func Unpack(ctx context.Context, r io.Reader, dir string, opts Options) (Stats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, fmt.Errorf("unpack: %w: %w", err, errkind.FailedPrecondition)
	}
	defer root.Close()
	er := &endReader{r: r}
	u := &unpacker{root: root, tr: tar.NewReader(er), er: er, privileged: opts.Privileged,
		asRoot: os.Geteuid() == 0, skipped: make(map[string]bool)}
	for {
		if err := ctx.Err(); err != nil {
			return u.stats, err
		}
		hdr, err := u.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.stats, err
		}
		if err := u.entry(hdr); err != nil {
			return u.stats, err
		}
	}
	return u.stats, u.finishDirs()
}

// endReader counts the zero bytes that ended what was read since zeros was
// last reset (before each header), so Unpack can tell an end-of-archive marker (two zero blocks) from a
// stream that simply stopped between entries: tar.Reader accepts both.
type endReader struct {
	r     io.Reader
	zeros int
}

func (e *endReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	for i := n - 1; i >= 0; i-- {
		if b[i] != 0 {
			e.zeros = n - 1 - i
			return n, err
		}
	}
	e.zeros += n
	return n, err
}

// unpacker holds the state of one Unpack call.
type unpacker struct {
	root       *os.Root
	tr         *tar.Reader
	er         *endReader // tr's source
	privileged bool       // Options.Privileged
	asRoot     bool       // ownership must be restored, not just attempted
	dirs       []*tar.Header
	skipped    map[string]bool // names of the entries left out
	stats      Stats
}

// next returns the next header, or io.EOF after a complete archive.
func (u *unpacker) next() (*tar.Header, error) {
	u.er.zeros = 0
	hdr, err := u.tr.Next()
	switch {
	case err == io.EOF:
		if u.er.zeros < 2*512 {
			return nil, fmt.Errorf("archive truncated: no end-of-archive marker: %w", io.ErrUnexpectedEOF)
		}
		return nil, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("archive truncated in a header: %w", io.ErrUnexpectedEOF)
	case errors.Is(err, tar.ErrHeader), errors.Is(err, tar.ErrInsecurePath):
		return nil, fmt.Errorf("read archive: %w: %w", err, errkind.InvalidArgument)
	case err != nil:
		return nil, fmt.Errorf("read archive: %w", err)
	}
	return hdr, nil
}

// entry extracts one archive entry.
func (u *unpacker) entry(hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // archive metadata, not a file
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("entry %q: the archive root must be a directory: %w", hdr.Name, errkind.InvalidArgument)
	}
	if err := u.noLinkAbove(name); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	if u.leftOut(hdr) {
		u.skipped[name] = true
		u.stats.Skipped++
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = u.dir(name, hdr)
	case tar.TypeReg:
		err = u.file(name, hdr)
	case tar.TypeSymlink:
		err = u.symlink(name, hdr)
	case tar.TypeLink:
		err = u.link(name, hdr)
	case tar.TypeFifo:
		err = u.fifo(name, hdr)
	default:
		return fmt.Errorf("entry %q: unsupported entry type %q: %w", hdr.Name, hdr.Typeflag, errkind.InvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	delete(u.skipped, name) // replaced by what is there now
	u.stats.Entries++
	return nil
}

// noLinkAbove returns an error wrapping [errkind.InvalidArgument] when an
// unprivileged Unpack would reach name through a symlink, even one that
// stays inside the directory: Pack never puts an entry below a symlink, so
// only a crafted archive (or a link planted in dir) asks for that.
func (u *unpacker) noLinkAbove(name string) error {
	if u.privileged {
		return nil
	}
	elems := strings.Split(name, "/")
	for i := 1; i < len(elems); i++ {
		p := strings.Join(elems[:i], "/")
		fi, err := u.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // made fresh from here on
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink: %w", p, errkind.InvalidArgument)
		}
	}
	return nil
}

// leftOut reports whether an unprivileged Unpack leaves out the entry: a
// fifo, a device node, or a hard link to one left out before.
func (u *unpacker) leftOut(hdr *tar.Header) bool {
	if u.privileged {
		return false
	}
	switch hdr.Typeflag {
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		return true
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		return err == nil && u.skipped[target]
	}
	return false
}

// cleanName returns the cleaned form of an entry or link name, relative to
// the archive root, or an error wrapping [errkind.InvalidArgument].
func cleanName(name string) (string, error) {
	var why string
	switch {
	case name == "":
		why = "empty name"
	case len(name) > maxNameLen:
		why = "name too long"
	case strings.ContainsRune(name, 0):
		why = "name contains NUL"
	case strings.HasPrefix(name, "/"):
		why = "absolute name"
	case slices.Contains(strings.Split(name, "/"), ".."):
		why = `name contains ".."`
	default:
		return path.Clean(name), nil
	}
	return "", fmt.Errorf("entry %q: %s: %w", shorten(name), why, errkind.InvalidArgument)
}

// shorten shortens a name for an error message.
func shorten(name string) string {
	if len(name) > 256 {
		return name[:256] + "..."
	}
	return name
}

// dir creates a directory, or keeps the existing one, and records its mode
// and mtime for finishDirs.
func (u *unpacker) dir(name string, hdr *tar.Header) error {
	if name != "." {
		if err := u.makeDir(name); err != nil {
			return err
		}
	}
	return u.keepDir(name, hdr)
}

// makeDir creates directory name and its parents. An existing directory is
// kept; any other file at name is replaced.
func (u *unpacker) makeDir(name string) error {
	if err := u.mkdirParents(name); err != nil {
		return err
	}
	fi, err := u.root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		if err := u.root.Remove(name); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return u.root.Mkdir(name, 0o700) // finishDirs sets the archived mode
}

// keepDir sets an extracted directory's owner now and queues its mode and
// mtime, which finishDirs sets once nothing more is written inside it.
func (u *unpacker) keepDir(name string, hdr *tar.Header) error {
	if err := u.chown(name, hdr); err != nil {
		return err
	}
	h := *hdr
	h.Name = name
	u.dirs = append(u.dirs, &h)
	return nil
}

// finishDirs sets the mode and mtime of every extracted directory, deepest
// first, so that setting one does not disturb another's mtime.
func (u *unpacker) finishDirs() error {
	slices.SortStableFunc(u.dirs, func(a, b *tar.Header) int {
		return depth(b.Name) - depth(a.Name)
	})
	for _, hdr := range u.dirs {
		// A later entry may have put a symlink in the directory's place,
		// which chmod would follow.
		if fi, err := u.root.Lstat(hdr.Name); err != nil || !fi.IsDir() {
			continue
		}
		if err := u.root.Chmod(hdr.Name, u.mode(hdr)); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		if err := u.setTimes(hdr.Name, hdr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	return nil
}

// depth is the number of path elements in a cleaned name; "." has none.
func depth(name string) int {
	if name == "." {
		return 0
	}
	return strings.Count(name, "/") + 1
}

// file extracts a regular file of exactly hdr.Size bytes.
func (u *unpacker) file(name string, hdr *tar.Header) error {
	if err := u.prepare(name); err != nil {
		return err
	}
	// O_EXCL: never write through a hard link left by an earlier entry.
	f, err := u.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	n, err := io.CopyN(f, u.tr, hdr.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	u.stats.Bytes += n
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("archive truncated after %d of %d bytes: %w", n, hdr.Size, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return err
	}
	return u.setAttrs(name, hdr)
}

// symlink creates a symlink. Its target is only text: the root keeps later
// entries from following it out of the directory.
func (u *unpacker) symlink(name string, hdr *tar.Header) error {
	if err := u.prepare(name); err != nil {
		return err
	}
	if err := u.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	if err := u.chown(name, hdr); err != nil {
		return err
	}
	return u.setTimes(name, hdr)
}

// link creates a hard link to an earlier entry of the archive.
func (u *unpacker) link(name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("link target: %w", err)
	}
	if err := u.noLinkAbove(target); err != nil {
		return fmt.Errorf("link target: %w", err)
	}
	if err := u.prepare(name); err != nil {
		return err
	}
	return u.root.Link(target, name)
}

// fifo creates a named pipe. mkfifoat runs on a parent directory opened
// through the root and never follows a final symlink, so it cannot escape.
func (u *unpacker) fifo(name string, hdr *tar.Header) error {
	if err := u.prepare(name); err != nil {
		return err
	}
	err := u.inParent(name, func(dirfd int, base string) error {
		return unix.Mkfifoat(dirfd, base, 0o600)
	})
	if err != nil {
		return &fs.PathError{Op: "mkfifoat", Path: name, Err: err}
	}
	return u.setAttrs(name, hdr)
}

// prepare makes name's parent directories and removes whatever is at name,
// so that a non-directory entry replaces it.
func (u *unpacker) prepare(name string) error {
	if err := u.mkdirParents(name); err != nil {
		return err
	}
	if err := u.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// mkdirParents creates the directories above name that the archive did not
// list before it.
func (u *unpacker) mkdirParents(name string) error {
	if parent := path.Dir(name); parent != "." {
		return u.root.MkdirAll(parent, 0o755)
	}
	return nil
}

// setAttrs sets the owner, mode and mtime of a file or fifo. The owner goes
// first because chown clears the setuid and setgid bits.
func (u *unpacker) setAttrs(name string, hdr *tar.Header) error {
	if err := u.chown(name, hdr); err != nil {
		return err
	}
	if err := u.root.Chmod(name, u.mode(hdr)); err != nil {
		return err
	}
	return u.setTimes(name, hdr)
}

// chown sets name's owner, without following a symlink at name, when the
// archive is privileged. A caller that is not root cannot give files away,
// so then EPERM is ignored.
func (u *unpacker) chown(name string, hdr *tar.Header) error {
	if !u.privileged {
		return nil
	}
	err := u.root.Lchown(name, hdr.Uid, hdr.Gid)
	if err != nil && !u.asRoot && errors.Is(err, unix.EPERM) {
		return nil
	}
	return err
}

// setTimes sets name's mtime, and its atime when the archive has one,
// without following a symlink at name.
func (u *unpacker) setTimes(name string, hdr *tar.Header) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if !hdr.AccessTime.IsZero() {
		ts[0] = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	err := u.inParent(name, func(dirfd int, base string) error {
		return unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil {
		return &fs.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
}

// inParent calls fn with a descriptor of name's parent directory, opened
// through the root, and name's last element, for *at calls os.Root lacks.
func (u *unpacker) inParent(name string, fn func(dirfd int, base string) error) error {
	d, err := u.root.OpenFile(path.Dir(name), os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := rc.Control(func(fd uintptr) { fnErr = fn(int(fd), path.Base(name)) }); err != nil {
		return err
	}
	return fnErr
}

// mode converts a header's mode to the FileMode chmod takes: all of it
// when the archive is privileged, only HostPerm otherwise.
func (u *unpacker) mode(hdr *tar.Header) fs.FileMode {
	m := hdr.FileInfo().Mode() & modeBits
	if !u.privileged {
		m &= HostPerm
	}
	return m
}

// Place moves the directory staging, as filled by Unpack, to target.
//
// When target does not exist, staging is renamed to it; its parent must
// exist. When target is a directory, staging is merged into it: first every
// staged entry is checked against target, and a staged directory over a
// non-directory (including a symlink) or a staged non-directory over a
// directory fails the whole call before anything changes. Then directories
// present in both are descended into and take the staged mode and mtime,
// and the staged owner when opts is privileged; every other staged entry
// is renamed over target's, atomically per entry, and the emptied staging
// directories are removed. target itself keeps its own attributes. staging
// and target must be on one file system. Place returns an error wrapping [errkind.FailedPrecondition] for a
// conflict, a target that is not a directory, or a missing parent.
func Place(staging, target string, opts Options) error {
	fi, err := os.Lstat(staging)
	if err != nil {
		return fmt.Errorf("place: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("place %s: staging is not a directory: %w", staging, errkind.FailedPrecondition)
	}
	fi, err = os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		return placeNew(staging, target) // which reports a bad parent
	case err != nil:
		return fmt.Errorf("place: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("place into %s: not a directory: %w", target, errkind.FailedPrecondition)
	}
	if err := checkConflicts(staging, target); err != nil {
		return err
	}
	return merge(staging, target, opts)
}

// placeNew renames staging to target, which does not exist yet.
func placeNew(staging, target string) error {
	parent := filepath.Dir(target)
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("place into %s: parent: %w: %w", target, err, errkind.FailedPrecondition)
	}
	if !fi.IsDir() {
		return fmt.Errorf("place into %s: parent %s is not a directory: %w", target, parent, errkind.FailedPrecondition)
	}
	if err := os.Rename(staging, target); err != nil {
		return fmt.Errorf("place: %w", err)
	}
	return nil
}

// checkConflicts reports the first staged entry whose kind (directory or
// not) differs from the entry at the same path in target.
func checkConflicts(staging, target string) error {
	return filepath.WalkDir(staging, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(staging, name)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(target, rel)
		fi, err := os.Lstat(dst)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if d.IsDir() {
				return filepath.SkipDir // moved whole; nothing below can conflict
			}
			return nil
		case err != nil:
			return fmt.Errorf("place: %w", err)
		case d.IsDir() && !fi.IsDir():
			return fmt.Errorf("place %s: staged directory over existing non-directory: %w", dst, errkind.FailedPrecondition)
		case !d.IsDir() && fi.IsDir():
			return fmt.Errorf("place %s: staged non-directory over existing directory: %w", dst, errkind.FailedPrecondition)
		}
		return nil
	})
}

// merge moves the entries of the staging directory src into the existing
// directory dst, then removes src.
func merge(src, dst string, opts Options) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("place: %w", err)
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
				if err := mergeDir(s, d, opts); err != nil {
					return err
				}
				continue
			}
		}
		if err := os.Rename(s, d); err != nil {
			return fmt.Errorf("place: %w", err)
		}
	}
	if err := os.Remove(src); err != nil {
		return fmt.Errorf("place: %w", err)
	}
	return nil
}

// mergeDir merges the staged directory src into dst and gives dst src's
// mode and mtime (and owner when privileged), after its contents so that
// the mtime sticks.
func mergeDir(src, dst string, opts Options) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("place: %w", err)
	}
	if err := merge(src, dst, opts); err != nil {
		return err
	}
	if opts.Privileged {
		st := fi.Sys().(*syscall.Stat_t)
		// Only root may give files away; others keep what they can.
		err = os.Lchown(dst, int(st.Uid), int(st.Gid))
		if err != nil && (os.Geteuid() == 0 || !errors.Is(err, unix.EPERM)) {
			return fmt.Errorf("place: %w", err)
		}
	}
	if err := os.Chmod(dst, fi.Mode()&modeBits); err != nil {
		return fmt.Errorf("place: %w", err)
	}
	if err := os.Chtimes(dst, time.Time{}, fi.ModTime()); err != nil {
		return fmt.Errorf("place: %w", err)
	}
	return nil
}
