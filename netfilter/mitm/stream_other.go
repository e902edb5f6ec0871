//go:build !unix

package mitm

import "errors"

// canReadFD says whether readFD works here: not on this platform, so
// upstream connections are not wrapped and guests not batched.
const canReadFD = false

func readFD(uintptr, []byte) (int, bool, error) { return 0, false, errors.ErrUnsupported }
