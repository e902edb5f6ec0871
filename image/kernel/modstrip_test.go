package kernel

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// signed appends a signature trailer the way scripts/sign-file does.
func signed(body []byte, sigLen int, idType byte) []byte {
	out := bytes.Clone(body)
	out = append(out, bytes.Repeat([]byte{0x5a}, sigLen)...)
	info := make([]byte, 12)
	info[2] = idType
	binary.BigEndian.PutUint32(info[8:], uint32(sigLen))
	out = append(out, info...)
	return append(out, moduleSigMagic...)
}

func TestStripSignature(t *testing.T) {
	body := makeKO(t, elf.EM_X86_64, "name=m", "vermagic=6.1.0 SMP")
	for _, tt := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{"signed", signed(body, 512, 2), body},
		{"unsigned", body, body},
		{"not PKCS#7", signed(body, 512, 1), signed(body, 512, 1)},
		{"empty", []byte{}, nil},
		{"length past the start", func() []byte {
			b := signed(body, 16, 2)
			binary.BigEndian.PutUint32(b[len(b)-len(moduleSigMagic)-4:], uint32(len(b)))
			return b
		}(), nil},
		{"only the magic", []byte(moduleSigMagic), []byte(moduleSigMagic)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == nil {
				want = tt.in
			}
			if got := StripSignature(tt.in); !bytes.Equal(got, want) {
				t.Errorf("StripSignature: got %d bytes, want %d", len(got), len(want))
			}
		})
	}
}

func sectionNames(t *testing.T, ko []byte) []string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var names []string
	for _, s := range f.Sections {
		names = append(names, s.Name)
	}
	return names
}

// TestHideBTFDebian renames the .BTF section of real Debian modules and
// leaves everything else, .modinfo included, as it was.
func TestHideBTFDebian(t *testing.T) {
	for _, arch := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		t.Run(string(arch), func(t *testing.T) {
			dir := debianModules(t, arch)
			for _, rel := range []string{"kernel/fs/ext4/ext4.ko", "kernel/drivers/virtio/virtio_ring.ko", "kernel/fs/overlayfs/overlay.ko"} {
				raw, err := ReadModule(filepath.Join(dir, rel))
				if errors.Is(err, fs.ErrNotExist) {
					continue // built into this arch's kernel
				}
				if err != nil {
					t.Fatal(err)
				}
				stripped := StripSignature(raw)
				if len(stripped) >= len(raw) || bytes.HasSuffix(stripped, []byte(moduleSigMagic)) {
					t.Errorf("%s: signature not stripped (%d → %d bytes)", rel, len(raw), len(stripped))
				}
				got := HideBTF(stripped)
				before, after := sectionNames(t, stripped), sectionNames(t, got)
				if len(before) != len(after) {
					t.Fatalf("%s: %d sections became %d", rel, len(before), len(after))
				}
				renamed := 0
				for i := range before {
					switch {
					case before[i] == ".BTF" && after[i] == ".BTf":
						renamed++
					case before[i] != after[i]:
						t.Errorf("%s: section %q became %q", rel, before[i], after[i])
					}
				}
				if renamed != 1 {
					t.Errorf("%s: %d .BTF sections renamed, want 1", rel, renamed)
				}
				if len(got) != len(stripped) {
					t.Errorf("%s: size changed", rel)
				}
				if _, err := parseModinfo(bytes.NewReader(got), rel); err != nil {
					t.Errorf("%s: modinfo after HideBTF: %v", rel, err)
				}
				if bytes.Equal(got, stripped) || !bytes.Equal(stripped, StripSignature(raw)) {
					t.Errorf("%s: HideBTF must copy, not edit its input", rel)
				}
			}
		})
	}
}

func TestHideBTFLeavesOthers(t *testing.T) {
	plain := makeKO(t, elf.EM_X86_64, "name=m")
	for _, tt := range []struct {
		name string
		in   []byte
	}{
		{"no .BTF section", plain},
		{"not ELF", []byte("not an ELF file at all, just some bytes of text here to be long enough for a header")},
		{"truncated", plain[:40]},
		{"big-endian", func() []byte { b := bytes.Clone(plain); b[5] = 2; return b }()},
		{"a name sharing the bytes of .BTF", koWithNames(t, "\x00.rela.BTF\x00.shstrtab\x00", 1, 6)},
		{"two .BTF sections", koWithNames(t, "\x00.BTF\x00.shstrtab\x00", 1, 1)},
		{"section table past the end", func() []byte {
			b := bytes.Clone(plain)
			binary.LittleEndian.PutUint64(b[0x28:], uint64(len(b)))
			return b
		}()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := HideBTF(tt.in); !bytes.Equal(got, tt.in) {
				t.Errorf("HideBTF changed a module it should leave alone")
			}
		})
	}
}

// koWithNames returns an ELF object whose section name table is names and
// whose two sections before it are named by the offsets a and b.
func koWithNames(t *testing.T, names string, a, b uint32) []byte {
	t.Helper()
	const ehsize = 64
	strOff := uint64(ehsize)
	shOff := (strOff + uint64(len(names)) + 7) &^ 7
	var buf bytes.Buffer
	writeELFHeader(&buf, elf.EM_X86_64, shOff, 4, 3)
	buf.WriteString(names)
	buf.Write(make([]byte, shOff-uint64(buf.Len())))
	shstr := uint32(bytes.Index([]byte(names), []byte(".shstrtab")))
	for _, s := range []elf.Section64{
		{},
		{Name: a, Type: uint32(elf.SHT_PROGBITS)},
		{Name: b, Type: uint32(elf.SHT_PROGBITS)},
		{Name: shstr, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(names)), Addralign: 1},
	} {
		binary.Write(&buf, binary.LittleEndian, &s)
	}
	return buf.Bytes()
}
