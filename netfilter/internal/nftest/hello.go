package nftest

import (
	"bytes"
	"encoding/binary"
)

// Hand-made TLS ClientHellos, for the tests of the engines' ClientHello
// parsing (odd record splits, extensions, SNI lists).

// Records wraps a handshake message in TLS records of at most size bytes.
func Records(msg []byte, size int) []byte {
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// HelloHead is a ClientHello body up to (not including) the extensions,
// with cipher suite bytes of the given length.
func HelloHead(suiteBytes int) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = binary.BigEndian.AppendUint16(body, uint16(suiteBytes))
	body = append(body, bytes.Repeat([]byte{0x13}, suiteBytes)...)
	return append(body, 1, 0) // null compression
}

// RawHandshake frames a ClientHello body as a handshake message.
func RawHandshake(body []byte) []byte {
	return append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
}

// Handshake builds a ClientHello handshake message from its extensions.
func Handshake(exts ...[]byte) []byte {
	body := HelloHead(2)
	all := bytes.Join(exts, nil)
	body = binary.BigEndian.AppendUint16(body, uint16(len(all)))
	return RawHandshake(append(body, all...))
}

// Ext is one ClientHello extension.
func Ext(typ uint16, data []byte) []byte {
	out := binary.BigEndian.AppendUint16(nil, typ)
	out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
	return append(out, data...)
}

// SNIData is a server_name extension's data naming names.
func SNIData(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(list))), list...)
}
