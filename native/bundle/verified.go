package bundle

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Verified vouches for one bundle file: Open hashed it, found every recorded sha256 right,
// and the file kept one identity (device, inode, size, modification and change times) from
// before the pass to after it. OpenVerified maps a file with that identity without hashing it
// again. It crosses processes as text (MarshalText, e.g. a command-line flag).
//
// Why the identity and not a re-hash: hashing a multi-gigabyte bundle takes seconds per
// process. A write to the file sets its modification and change times (the change time no
// user can set back), and a replacement changes its inode, so a file with the same identity
// holds what was hashed. The times tick coarsely (a few milliseconds on Linux), so a rewrite
// within the tick of the file's previous change would go unseen; the harness's fingerprints
// before and after a run still catch it.
type Verified struct {
	SHA256 string // of the whole file
	id     fileID
}

// fileID is what os.Stat says about a file that changes whenever its content does.
type fileID struct {
	dev, ino               uint64
	size, mtimeNs, ctimeNs int64
}

func fileIDOf(st os.FileInfo) fileID {
	id := fileID{size: st.Size(), mtimeNs: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino, id.ctimeNs = uint64(sys.Dev), sys.Ino, sys.Ctim.Nano()
	}
	return id
}

// Matches reports whether fi (from os.Stat or File.Stat) describes the file v vouches for,
// unchanged: a process that read parts of the file itself can check that it read what Open
// hashed, by matching the file as it was before and after reading.
func (v Verified) Matches(fi os.FileInfo) bool {
	return v.SHA256 != "" && fi != nil && fileIDOf(fi) == v.id
}

// ErrChanged is wrapped by the error of OpenVerified (and of Open) when the file is no longer
// the one that was verified: it was rewritten, replaced or touched. Open it again to hash it.
var ErrChanged = errors.New("file changed")

// check compares the open file's identity now with id.
func (id fileID) check(f *os.File, path, when string) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bundle %s: stat: %w", path, err)
	}
	if now := fileIDOf(st); now != id {
		return now.changedError(id, path, when)
	}
	return nil
}

// changedError says that the file changed from was to id, and how.
func (id fileID) changedError(was fileID, path, when string) error {
	var d []string
	if id.dev != was.dev || id.ino != was.ino {
		d = append(d, fmt.Sprintf("replaced: device/inode %d/%d, was %d/%d", id.dev, id.ino, was.dev, was.ino))
	}
	if id.size != was.size {
		d = append(d, fmt.Sprintf("size %d, was %d", id.size, was.size))
	}
	if id.mtimeNs != was.mtimeNs {
		d = append(d, fmt.Sprintf("modified %s, was %s", stamp(id.mtimeNs), stamp(was.mtimeNs)))
	}
	if id.ctimeNs != was.ctimeNs {
		d = append(d, fmt.Sprintf("status changed %s, was %s", stamp(id.ctimeNs), stamp(was.ctimeNs)))
	}
	return fmt.Errorf("bundle %s: %w %s (%s)", path, ErrChanged, when, strings.Join(d, "; "))
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// MarshalText writes v as "sha256=HEX,dev=N,ino=N,size=N,mtime=NS,ctime=NS", and the zero
// Verified (nothing verified) as "".
func (v Verified) MarshalText() ([]byte, error) {
	if v.SHA256 == "" {
		return []byte{}, nil
	}
	return fmt.Appendf(nil, "sha256=%s,dev=%d,ino=%d,size=%d,mtime=%d,ctime=%d",
		v.SHA256, v.id.dev, v.id.ino, v.id.size, v.id.mtimeNs, v.id.ctimeNs), nil
}

// UnmarshalText reads what MarshalText wrote; every field is required.
func (v *Verified) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*v = Verified{}
		return nil
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("bundle: verified %q: %s; pass what Bundle.Verified().MarshalText() wrote", text, fmt.Sprintf(format, args...))
	}
	fields := strings.Split(string(text), ",")
	keys := []string{"sha256", "dev", "ino", "size", "mtime", "ctime"}
	if len(fields) != len(keys) {
		return fail("has %d fields, want %d (%s)", len(fields), len(keys), strings.Join(keys, ","))
	}
	var out Verified
	dsts := []any{&out.SHA256, &out.id.dev, &out.id.ino, &out.id.size, &out.id.mtimeNs, &out.id.ctimeNs}
	for i, f := range fields {
		val, ok := strings.CutPrefix(f, keys[i]+"=")
		if !ok {
			return fail("field %d is %q, want %s=...", i+1, f, keys[i])
		}
		var err error
		switch dst := dsts[i].(type) {
		case *string:
			if !hex64.MatchString(val) {
				return fail("sha256 %q is not 64 lowercase hex digits", val)
			}
			*dst = val
		case *uint64:
			*dst, err = strconv.ParseUint(val, 10, 64)
		case *int64:
			*dst, err = strconv.ParseInt(val, 10, 64)
		}
		if err != nil {
			return fail("%s %q is not an integer", keys[i], val)
		}
	}
	*v = out
	return nil
}
