package kernel

import (
	"bytes"
	"encoding/binary"
)

// moduleSigMagic ends a module that carries an appended signature
// (scripts/sign-file in the kernel tree).
const moduleSigMagic = "~Module signature appended~\n"

// StripSignature returns module without its appended signature, or module
// itself when it has none or a trailer this function does not recognise.
//
// The guest kernel checks a signed module's signature on every load: a
// SHA-256 of the whole module and an RSA verification, seconds of work per
// boot under emulation for what the guest loads. The kernels vibedom boots
// do not enforce signatures (CONFIG_MODULE_SIG_FORCE off, no module.sig_enforce
// on the command line vibedom passes), and the check guards nothing here:
// the modules come from the verified kernel package through the host, and
// root in the guest may load modules of its own anyway. An unsigned module
// loads the same, marking the kernel tainted ("module verification failed").
func StripSignature(module []byte) []byte {
	// struct module_signature: algo, hash, id_type, signer_len, key_id_len,
	// three bytes of padding, then sig_len as a big-endian u32.
	const infoLen = 12
	const pkcs7 = 2 // PKEY_ID_PKCS7, the only form the kernel accepts
	end := len(module) - len(moduleSigMagic)
	if end < infoLen || !bytes.Equal(module[end:], []byte(moduleSigMagic)) {
		return module
	}
	info := module[end-infoLen : end]
	if info[2] != pkcs7 || info[0] != 0 || info[1] != 0 || info[3] != 0 || info[4] != 0 {
		return module
	}
	sigLen := int64(binary.BigEndian.Uint32(info[8:]))
	body := int64(end-infoLen) - sigLen
	if sigLen == 0 || body <= 0 {
		return module
	}
	return module[:body]
}

// btfName is the section of a module holding its BPF type information.
const btfName = ".BTF"

// HideBTF returns module with its .BTF section renamed, so that the guest
// kernel does not find it, or module itself when it has none or is not a
// little-endian 64-bit ELF file this function can edit in place.
//
// A kernel built with CONFIG_DEBUG_INFO_BTF_MODULES parses and validates a
// module's type information on every load (for BPF programs that trace
// the module, which the guest never runs): a large part of loading ext4
// under emulation. The section is not loaded into memory either way; only
// its name changes, and only when no other section's name shares those
// bytes of the section name table.
func HideBTF(module []byte) []byte {
	le := binary.LittleEndian
	if len(module) < 64 || string(module[:4]) != "\x7fELF" || module[4] != 2 || module[5] != 1 {
		return module
	}
	shoff := le.Uint64(module[0x28:])
	shentsize := uint64(le.Uint16(module[0x3a:]))
	shnum := uint64(le.Uint16(module[0x3c:]))
	shstrndx := uint64(le.Uint16(module[0x3e:]))
	size := uint64(len(module))
	if shentsize < 64 || shnum == 0 || shstrndx >= shnum || shoff > size || shnum*shentsize > size-shoff {
		return module
	}
	hdr := func(i uint64) []byte { return module[shoff+i*shentsize : shoff+(i+1)*shentsize] }
	strs := hdr(shstrndx)
	stroff, strsize := le.Uint64(strs[0x18:]), le.Uint64(strs[0x20:])
	if stroff > size || strsize > size-stroff {
		return module
	}
	names := module[stroff : stroff+strsize]
	at := -1
	for i := uint64(0); i < shnum; i++ {
		n := uint64(le.Uint32(hdr(i)))
		if n+uint64(len(btfName))+1 <= strsize && string(names[n:n+uint64(len(btfName))+1]) == btfName+"\x00" {
			if at >= 0 {
				return module // two sections named .BTF: leave it alone
			}
			at = int(n)
		}
	}
	if at < 0 {
		return module
	}
	for i := uint64(0); i < shnum; i++ {
		// Another name ending in ".BTF" shares the bytes (".rela.BTF").
		n := int(le.Uint32(hdr(i)))
		if n != at && n < at+len(btfName) && at < n+len(cstring(names[min(n, len(names)):])) {
			return module
		}
	}
	out := bytes.Clone(module)
	// ".BTF" becomes ".BTf": a name no kernel looks for.
	out[stroff+uint64(at)+uint64(len(btfName))-1] = 'f'
	return out
}

// cstring is b up to its first NUL.
func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
