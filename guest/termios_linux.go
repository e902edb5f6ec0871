package guest

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Terminal mode opcodes of an SSH pty-req (RFC 4254 section 8, RFC 8160).
var (
	modeChars = map[byte]int{
		1: unix.VINTR, 2: unix.VQUIT, 3: unix.VERASE, 4: unix.VKILL, 5: unix.VEOF, 6: unix.VEOL,
		7: unix.VEOL2, 8: unix.VSTART, 9: unix.VSTOP, 10: unix.VSUSP, 12: unix.VREPRINT,
		13: unix.VWERASE, 14: unix.VLNEXT, 18: unix.VDISCARD,
	}
	modeIflag = map[byte]uint32{
		30: unix.IGNPAR, 31: unix.PARMRK, 32: unix.INPCK, 33: unix.ISTRIP, 34: unix.INLCR, 35: unix.IGNCR,
		36: unix.ICRNL, 37: unix.IUCLC, 38: unix.IXON, 39: unix.IXANY, 40: unix.IXOFF, 41: unix.IMAXBEL,
		42: unix.IUTF8,
	}
	modeLflag = map[byte]uint32{
		50: unix.ISIG, 51: unix.ICANON, 52: unix.XCASE, 53: unix.ECHO, 54: unix.ECHOE, 55: unix.ECHOK,
		56: unix.ECHONL, 57: unix.NOFLSH, 58: unix.TOSTOP, 59: unix.IEXTEN, 60: unix.ECHOCTL,
		61: unix.ECHOKE, 62: unix.PENDIN,
	}
	modeOflag = map[byte]uint32{
		70: unix.OPOST, 71: unix.OLCUC, 72: unix.ONLCR, 73: unix.OCRNL, 74: unix.ONOCR, 75: unix.ONLRET,
	}
	modeCflag = map[byte]uint32{
		92: unix.PARENB, 93: unix.PARODD,
	}
)

// applyModes sets the encoded terminal modes of a pty-req on t. Unknown
// opcodes in 1..159 are skipped; an opcode of 160 or more (whose argument
// format is undefined), the end marker or truncated input stop the parse.
// Speeds are ignored: a pseudo-terminal has none.
func applyModes(t *unix.Termios, modes []byte) {
	for len(modes) >= 5 {
		op := modes[0]
		if op == 0 || op >= 160 {
			return
		}
		v := binary.BigEndian.Uint32(modes[1:5])
		modes = modes[5:]
		set := func(flags *uint32, bit uint32) {
			if v != 0 {
				*flags |= bit
			} else {
				*flags &^= bit
			}
		}
		if i, ok := modeChars[op]; ok {
			if v >= 255 {
				v = 0 // disabled: 255 is macOS's _POSIX_VDISABLE, 0 Linux's
			}
			t.Cc[i] = uint8(v)
			continue
		}
		if b, ok := modeIflag[op]; ok {
			set(&t.Iflag, b)
			continue
		}
		if b, ok := modeLflag[op]; ok {
			set(&t.Lflag, b)
			continue
		}
		if b, ok := modeOflag[op]; ok {
			set(&t.Oflag, b)
			continue
		}
		if b, ok := modeCflag[op]; ok {
			set(&t.Cflag, b)
			continue
		}
		switch op {
		case 90: // CS7
			if v != 0 {
				t.Cflag = t.Cflag&^unix.CSIZE | unix.CS7
			}
		case 91: // CS8
			if v != 0 {
				t.Cflag = t.Cflag&^unix.CSIZE | unix.CS8
			}
		}
	}
}

// setModes applies modes to the terminal open at fd.
func setModes(fd int, modes []byte) error {
	if len(modes) == 0 {
		return nil
	}
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return err
	}
	applyModes(t, modes)
	return unix.IoctlSetTermios(fd, unix.TCSETS, t)
}
