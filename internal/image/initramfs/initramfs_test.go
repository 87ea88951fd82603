package initramfs

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ulikunitz/xz"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/image/initramfs/cpio"
	"space/internal/image/kernel"
	"space/internal/testenv"
)

func TestResolve(t *testing.T) {
	// A kernel where ext4 and crc16 are built in.
	deps := map[string][]string{
		"virtio_ring": nil, "virtio": {"virtio_ring"},
		"virtio_pci_modern_dev": nil, "virtio_pci_legacy_dev": nil,
		"virtio_pci":   {"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"},
		"virtio_net":   {"virtio_ring", "virtio", "net_failover"},
		"net_failover": {"failover"}, "failover": nil,
		"virtio_rng": {"virtio", "virtio_ring"},
		"jbd2":       {"crc16"},
		"loop_a":     {"loop_b"}, "loop_b": {"loop_a"},
	}
	builtins := map[string]bool{"ext4": true, "crc16": true}
	kind := func(n string) moduleKind {
		if builtins[n] {
			return builtin
		}
		if _, ok := deps[n]; ok {
			return loadable
		}
		return unknown
	}
	depends := func(n string) ([]string, error) { return deps[n], nil }
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr error
	}{
		{"deps first", []string{"virtio_pci"}, []string{"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio", "virtio_pci"}, nil},
		{"order kept, each once", []string{"virtio_net", "virtio", "virtio-rng"}, []string{"virtio_ring", "virtio", "failover", "net_failover", "virtio_net", "virtio_rng"}, nil},
		{"builtins skipped", []string{"ext4", "jbd2"}, []string{"jbd2"}, nil},
		{"unknown listed", []string{"nope", "virtio", "alsonope"}, nil, errkind.NotFound},
		{"cycle", []string{"loop_a"}, nil, errkind.InvalidArgument},
		{"empty", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolve(tt.in, kind, depends)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("resolve(%v) = %v, want %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("resolve(%v) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
	_, err := resolve([]string{"nope", "virtio", "alsonope"}, kind, depends)
	if err == nil || !strings.Contains(err.Error(), "alsonope, nope") {
		t.Errorf("resolve(unknown) = %v, want an error listing alsonope, nope", err)
	}
}

// fakeModule returns a relocatable x86-64 ELF whose .modinfo section holds
// the given key=value strings.
func fakeModule(t *testing.T, modinfo ...string) []byte {
	t.Helper()
	info := []byte(strings.Join(modinfo, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize = 64
	infoOff := uint64(ehsize)
	shstrOff := infoOff + uint64(len(info))
	shoff := (shstrOff + uint64(len(shstr)) + 7) &^ 7
	hdr := elf.Header64{
		Type: uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Shoff: shoff, Ehsize: ehsize, Shentsize: 64, Shnum: 3, Shstrndx: 2,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, hdr)
	b.Write(info)
	b.Write(shstr)
	b.Write(make([]byte, shoff-uint64(b.Len())))
	binary.Write(&b, binary.LittleEndian, []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: infoOff, Size: uint64(len(info)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstr)), Addralign: 1},
	})
	return b.Bytes()
}

// fakeKernel writes a modules tree: files maps paths below kernel/ to the
// depends= of a fake module there.
func fakeKernel(t *testing.T, files map[string]string, builtins string) *kernel.Kernel {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lib/modules/9.9.9-1-test")
	for p, deps := range files {
		obj := fakeModule(t, "license=GPL", "depends="+deps, "name="+moduleName(filepath.Base(p)))
		switch {
		case strings.HasSuffix(p, ".gz"):
			var b bytes.Buffer
			zw := gzip.NewWriter(&b)
			zw.Write(obj)
			zw.Close()
			obj = b.Bytes()
		case strings.HasSuffix(p, ".xz"):
			var b bytes.Buffer
			zw, _ := xz.NewWriter(&b)
			zw.Write(obj)
			zw.Close()
			obj = b.Bytes()
		}
		full := filepath.Join(dir, "kernel", p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := os.WriteFile(full, obj, 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(builtins), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return &kernel.Kernel{Version: "9.9.9-1-test", SHA256: "abc", ModulesDir: dir}
}

func readArchive(t *testing.T, r io.Reader) map[string]cpio.Entry {
	t.Helper()
	cr := cpio.NewReader(r)
	got := map[string]cpio.Entry{}
	var names []string
	for {
		e, err := cr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		got[e.Name] = e
		names = append(names, e.Name)
	}
	if !slices.IsSorted(names) {
		t.Errorf("archive entries not sorted: %v", names)
	}
	return got
}

func writeAgent(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "space-agent")
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

func TestWrite(t *testing.T) {
	k := fakeKernel(t, map[string]string{
		"drivers/virtio/virtio_ring.ko":           "",
		"drivers/virtio/virtio.ko.xz":             "virtio_ring",
		"drivers/char/hw_random/virtio-rng.ko.gz": "virtio,virtio_ring",
		"drivers/block/virtio_blk.ko":             "virtio,virtio_ring",
		"drivers/unused/unused.ko":                "",
	}, "kernel/fs/ext4/ext4.ko\nkernel/fs/jbd2/jbd2.ko\n")
	spec := Spec{Agent: writeAgent(t, "agent binary"), Kernel: k, Modules: []string{"virtio_blk", "virtio_rng", "ext4"}}
	var b bytes.Buffer
	if err := Write(t.Context(), spec, &b); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	got := readArchive(t, bytes.NewReader(b.Bytes()))

	mod := "lib/modules/9.9.9-1-test/"
	want := map[string]fs.FileMode{
		"dev": fs.ModeDir | 0o755, "proc": fs.ModeDir | 0o555, "sys": fs.ModeDir | 0o555,
		"run": fs.ModeDir | 0o755, "tmp": fs.ModeDir | fs.ModeSticky | 0o777, "mnt": fs.ModeDir | 0o755,
		"lib": fs.ModeDir | 0o755, "lib/modules": fs.ModeDir | 0o755, strings.TrimSuffix(mod, "/"): fs.ModeDir | 0o755,
		"dev/console":          fs.ModeDevice | fs.ModeCharDevice | 0o600,
		"init":                 0o755,
		mod + "virtio_ring.ko": 0o644, mod + "virtio.ko": 0o644, mod + "virtio_blk.ko": 0o644,
		mod + "virtio_rng.ko": 0o644, mod + LoadOrderFile: 0o644,
	}
	gotModes := map[string]fs.FileMode{}
	for n, e := range got {
		gotModes[n] = e.Mode
	}
	if diff := cmp.Diff(want, gotModes); diff != "" {
		t.Errorf("archive entries mismatch (-want +got):\n%s", diff)
	}
	if c := got["dev/console"]; c.Major != 5 || c.Minor != 1 {
		t.Errorf("dev/console = %d,%d, want 5,1", c.Major, c.Minor)
	}
	if diff := cmp.Diff("agent binary", string(got["init"].Data)); diff != "" {
		t.Errorf("init content mismatch (-want +got):\n%s", diff)
	}
	wantOrder := "virtio_ring.ko\nvirtio.ko\nvirtio_blk.ko\nvirtio_rng.ko\n"
	if diff := cmp.Diff(wantOrder, string(got[mod+LoadOrderFile].Data)); diff != "" {
		t.Errorf("load.order mismatch (-want +got):\n%s", diff)
	}
	// Compressed modules are stored uncompressed.
	if deps, err := modinfoDepends(got[mod+"virtio_rng.ko"].Data); err != nil || !slices.Equal(deps, []string{"virtio", "virtio_ring"}) {
		t.Errorf("stored virtio_rng.ko: depends %v, %v; want an ELF module depending on virtio, virtio_ring", deps, err)
	}

	var again bytes.Buffer
	if err := Write(t.Context(), spec, &again); err != nil {
		t.Fatalf("Write() again = %v", err)
	}
	if !bytes.Equal(b.Bytes(), again.Bytes()) {
		t.Errorf("Write() twice gave different bytes")
	}
}

func TestWriteErrors(t *testing.T) {
	k := fakeKernel(t, map[string]string{"a.ko": "gone", "z.ko.zst": ""}, "")
	agent := writeAgent(t, "x")
	tests := []struct {
		name    string
		spec    Spec
		wantErr error
	}{
		{"no kernel", Spec{Agent: agent}, errkind.InvalidArgument},
		{"no agent", Spec{Agent: filepath.Join(t.TempDir(), "none"), Kernel: k}, fs.ErrNotExist},
		{"missing dependency", Spec{Agent: agent, Kernel: k, Modules: []string{"a"}}, errkind.NotFound},
		{"zstd module", Spec{Agent: agent, Kernel: k, Modules: []string{"z"}}, errkind.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Write(t.Context(), tt.spec, io.Discard); !errors.Is(err, tt.wantErr) {
				t.Errorf("Write() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestBuild(t *testing.T) {
	k := fakeKernel(t, map[string]string{"virtio_ring.ko": ""}, "")
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	spec := Spec{Agent: writeAgent(t, "v1"), Kernel: k, Modules: []string{"virtio_ring"}}
	first, err := Build(t.Context(), cache, spec)
	if err != nil {
		t.Fatalf("Build() = %v", err)
	}
	second, err := Build(t.Context(), cache, spec)
	if err != nil || second != first {
		t.Errorf("Build() again = %q, %v; want %q", second, err, first)
	}
	other := spec
	other.Agent = writeAgent(t, "v2")
	third, err := Build(t.Context(), cache, other)
	if err != nil || third == first {
		t.Errorf("Build(other agent) = %q, %v; want a new entry", third, err)
	}
	f, err := os.Open(third)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer f.Close()
	if got := readArchive(t, f)["init"].Data; string(got) != "v2" {
		t.Errorf("Build(other agent) /init = %q, want %q", got, "v2")
	}
}

// TestBuildHost builds the default initramfs for the host's real cloud
// kernel.
func TestBuildHost(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireTool(t, testenv.TierSlow, "apt-get", "apt")
	cache, err := cachedir.Open(testenv.CacheDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	k, err := kernel.Fetch(t.Context(), kernel.Config{Cache: cache})
	if err != nil {
		t.Fatalf("kernel.Fetch() = %v", err)
	}
	p, err := Build(t.Context(), cache, Spec{Agent: writeAgent(t, "dummy agent"), Kernel: k})
	if err != nil {
		t.Fatalf("Build() = %v", err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer f.Close()
	got := readArchive(t, f)
	mod := "lib/modules/" + k.Version + "/"
	order := strings.Fields(string(got[mod+LoadOrderFile].Data))
	t.Logf("kernel %s load order: %s", k.Version, strings.Join(order, " "))

	pos := map[string]int{}
	for i, name := range order {
		pos[strings.TrimSuffix(name, ".ko")] = i
		e, ok := got[mod+name]
		if !ok {
			t.Errorf("load.order lists %s, which is not in the archive", name)
			continue
		}
		deps, err := modinfoDepends(e.Data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, d := range deps {
			if dp, ok := pos[normalize(d)]; !ok || dp >= i {
				t.Errorf("load.order has %s before its dependency %s", name, d)
			}
		}
	}
	for _, pair := range [][2]string{{"virtio_ring", "virtio"}, {"virtio", "virtio_pci"}, {"virtio_pci_modern_dev", "virtio_pci"},
		{"failover", "net_failover"}, {"net_failover", "virtio_net"}, {"vsock", "vmw_vsock_virtio_transport"}} {
		a, aok := pos[pair[0]]
		b, bok := pos[pair[1]]
		if !aok || !bok || a >= b {
			t.Errorf("load.order: %s at %d (%v), %s at %d (%v); want both, the first earlier", pair[0], a, aok, pair[1], b, bok)
		}
	}
	tree, err := scanTree(k.ModulesDir)
	if err != nil {
		t.Fatalf("scan modules: %v", err)
	}
	for _, m := range DefaultModules {
		_, listed := pos[m]
		if listed == tree.builtin[m] {
			t.Errorf("load.order lists %s: %v; built in: %v; want exactly one", m, listed, tree.builtin[m])
		}
	}
	if c := got["dev/console"]; c.Mode != fs.ModeDevice|fs.ModeCharDevice|0o600 || c.Major != 5 || c.Minor != 1 {
		t.Errorf("dev/console = %v %d,%d; want char device 5,1 mode 0600", c.Mode, c.Major, c.Minor)
	}
}
