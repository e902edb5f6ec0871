package ext4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// The layout Write produces, in 4 KiB blocks:
//
//	group 0:  superblock (byte 1024 of block 0), group descriptors, then the
//	          block bitmaps, inode bitmaps and inode tables of every group
//	          (flex_bg: one flex group spanning the file system)
//	backups:  superblock and descriptors at the start of groups 1, 3^n,
//	          5^n, 7^n (sparse_super)
//	data:     directories, extent leaves, symlink targets and file contents,
//	          allocated in inode order, each file contiguous except where a
//	          backup superblock interrupts it
//
// Features: filetype, extents, flex_bg (incompat); sparse_super, large_file,
// dir_nlink, extra_isize (ro_compat); ext_attr when an inode has xattrs. No
// journal, no checksums (metadata_csum), no htree: the image is mounted
// read-only, where none of these matter, and each is a source of
// non-determinism or complexity. Directories are linear lists of blocks.
const (
	blockSize      = 4096
	blocksPerGroup = 8 * blockSize
	inodeSize      = 256
	extraIsize     = 32
	firstIno       = 11
	rootIno        = 2
	descSize       = 32
	inodesPerBlock = blockSize / inodeSize
	maxExtentLen   = 32768
	// maxLinks is the largest i_links_count; dir_nlink lets a directory
	// with more subdirectories say 1.
	maxLinks = 65000
)

// Feature flags.
const (
	compatExtAttr     = 0x0008
	incompatFiletype  = 0x0002
	incompatExtents   = 0x0040
	incompatFlexBG    = 0x0200
	roCompatSparse    = 0x0001
	roCompatLargeFile = 0x0002
	roCompatDirNlink  = 0x0020
	roCompatExtraSize = 0x0040
	extentsFlag       = 0x80000
)

// Errors.
var (
	// ErrTree means the tree cannot be written as given (bad name,
	// duplicate, cycle, wrong size); the message names the path.
	ErrTree = errors.New("ext4: bad tree")
)

// inode is one Node with its place in the image.
type inode struct {
	n      *Node
	ino    uint32
	path   string // first name, for errors
	links  int
	parent uint32 // directories only
	dirs   int    // subdirectories (directories only)
	// data: for directories the encoded blocks; for slow symlinks the target.
	data   []byte
	nblk   uint64 // data blocks
	extent []extent
	leaves []uint64 // extent tree leaf blocks (depth 1), nil when in-inode
	xattr  []byte   // encoded in-inode xattr area (after the magic), nil if none
}

type extent struct {
	logical uint32
	start   uint64
	length  uint32
}

// writer holds the state of one Write.
type writer struct {
	opts    Options
	inodes  []*inode // index ino-1; reserved ones nil
	byNode  map[*Node]*inode
	groups  uint64
	total   uint64 // blocks
	ipg     uint32 // inodes per group
	itb     uint64 // inode table blocks per group
	gdtBlk  uint64
	bb, ib  []uint64 // each group's block and inode bitmap
	it      []uint64 // each group's inode table (w.itb blocks)
	used    []bool   // block -> allocated (metadata and data)
	next    uint64   // allocation cursor
	hasXatt bool
	large   bool
}

// Write writes the tree under root (a directory) into f as an ext4 file
// system image and returns its figures. f must be empty; Write sets its
// size. Names, sizes and structure are checked first: nothing is written
// for a tree that cannot be.
func Write(f *os.File, root *Node, opts Options) (Stats, error) {
	if root == nil || root.Type != TypeDir {
		return Stats{}, fmt.Errorf("%w: the root must be a directory", ErrTree)
	}
	if len(opts.Label) > 16 {
		return Stats{}, fmt.Errorf("%w: label %q is longer than 16 bytes", ErrTree, opts.Label)
	}
	w := &writer{opts: opts, byNode: map[*Node]*inode{}}
	if err := w.number(root); err != nil {
		return Stats{}, err
	}
	if err := w.encodeDirs(); err != nil {
		return Stats{}, err
	}
	if err := w.layout(); err != nil {
		return Stats{}, err
	}
	if err := f.Truncate(int64(w.total) * blockSize); err != nil {
		return Stats{}, err
	}
	if err := w.write(f); err != nil {
		return Stats{}, err
	}
	var usedBlocks uint64
	for _, u := range w.used {
		if u {
			usedBlocks++
		}
	}
	return Stats{
		Size: int64(w.total) * blockSize, Blocks: w.total, Inodes: uint64(w.ipg) * w.groups,
		UsedBlocks: usedBlocks, UsedInodes: uint64(len(w.inodes)),
	}, nil
}

// validName reports whether name can be a directory entry.
func validName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("name %q is reserved", name)
	case len(name) > 255:
		return fmt.Errorf("name is %d bytes, longer than 255", len(name))
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("name %q holds '/' or NUL", name)
	}
	return nil
}

// number assigns inode numbers in a deterministic depth-first walk (names
// sorted), checks the tree, and counts links.
func (w *writer) number(root *Node) error {
	// A shallow copy, so adding lost+found leaves the caller's tree alone.
	rc := *root
	rc.Entries = append([]Dirent(nil), root.Entries...)
	root = &rc
	w.inodes = make([]*inode, firstIno-1) // 1..10 reserved
	ri := &inode{n: root, ino: rootIno, path: "/", parent: rootIno}
	w.inodes[rootIno-1] = ri
	w.byNode[root] = ri
	// lost+found, which e2fsck expects, unless the tree has one.
	hasLF := false
	for _, e := range root.Entries {
		if e.Name == "lost+found" {
			hasLF = true
		}
	}
	if !hasLF {
		lf := &Node{Type: TypeDir, Meta: Meta{Mode: 0o700, ModTime: w.opts.Time}}
		root.Entries = append(root.Entries, Dirent{Name: "lost+found", Node: lf})
	}
	onStack := map[*Node]bool{root: true}
	var walk func(dir *inode) error
	walk = func(dir *inode) error {
		ents := dir.n.Entries
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
		for i, e := range ents {
			p := path.Join(dir.path, e.Name)
			if err := validName(e.Name); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrTree, dir.path, err)
			}
			if i > 0 && ents[i-1].Name == e.Name {
				return fmt.Errorf("%w: %s: two entries named %q", ErrTree, dir.path, e.Name)
			}
			if e.Node == nil {
				return fmt.Errorf("%w: %s: no node", ErrTree, p)
			}
			if in, ok := w.byNode[e.Node]; ok {
				if e.Node.Type == TypeDir {
					if onStack[e.Node] {
						return fmt.Errorf("%w: %s: a directory inside itself (a cycle)", ErrTree, p)
					}
					return fmt.Errorf("%w: %s: a directory under two names (%s)", ErrTree, p, in.path)
				}
				in.links++
				continue
			}
			in := &inode{n: e.Node, path: p, links: 1}
			if err := w.check(in); err != nil {
				return err
			}
			w.inodes = append(w.inodes, in)
			in.ino = uint32(len(w.inodes))
			w.byNode[e.Node] = in
			if e.Node.Type == TypeDir {
				in.parent = dir.ino
				dir.dirs++
				onStack[e.Node] = true
				if err := walk(in); err != nil {
					return err
				}
				delete(onStack, e.Node)
			}
		}
		return nil
	}
	if err := walk(ri); err != nil {
		return err
	}
	if uint64(len(w.inodes)) > 1<<32-1 {
		return fmt.Errorf("%w: too many inodes", ErrTree)
	}
	return nil
}

// check validates one node's own fields.
func (w *writer) check(in *inode) error {
	n := in.n
	switch n.Type {
	case TypeFile:
		if n.Size < 0 {
			return fmt.Errorf("%w: %s: negative size", ErrTree, in.path)
		}
		if n.Size > 0 && n.Open == nil {
			return fmt.Errorf("%w: %s: no content", ErrTree, in.path)
		}
		if n.Size >= 1<<31 {
			w.large = true
		}
		if n.Size > 1<<44 {
			return fmt.Errorf("%w: %s: larger than 16 TiB", ErrTree, in.path)
		}
	case TypeSymlink:
		if n.Target == "" || len(n.Target) > 4095 || strings.Contains(n.Target, "\x00") {
			return fmt.Errorf("%w: %s: symlink target must be 1 to 4095 bytes without NUL", ErrTree, in.path)
		}
	case TypeDir, TypeCharDev, TypeBlockDev, TypeFIFO, TypeSocket:
	default:
		return fmt.Errorf("%w: %s: unknown node type %d", ErrTree, in.path, n.Type)
	}
	if len(n.Meta.Xattrs) > 0 {
		b, err := encodeXattrs(n.Meta.Xattrs)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrTree, in.path, err)
		}
		in.xattr = b
		w.hasXatt = true
	}
	return nil
}

// fileType is the directory entry type of a node.
func fileType(t Type) byte {
	switch t {
	case TypeFile:
		return 1
	case TypeDir:
		return 2
	case TypeCharDev:
		return 3
	case TypeBlockDev:
		return 4
	case TypeFIFO:
		return 5
	case TypeSocket:
		return 6
	case TypeSymlink:
		return 7
	}
	return 0
}

// encodeDirs encodes every directory's blocks.
func (w *writer) encodeDirs() error {
	for _, in := range w.inodes {
		if in == nil || in.n.Type != TypeDir {
			continue
		}
		var blocks []byte
		var cur []byte
		last := -1 // offset of the last entry in cur
		add := func(ino uint32, name string, ft byte) {
			need := (8 + len(name) + 3) &^ 3
			if len(cur)+need > blockSize {
				// Stretch the last entry to the block's end.
				binary.LittleEndian.PutUint16(cur[last+4:], uint16(blockSize-last))
				cur = append(cur, make([]byte, blockSize-len(cur))...)
				blocks = append(blocks, cur...)
				cur, last = nil, -1
			}
			e := make([]byte, need)
			binary.LittleEndian.PutUint32(e[0:], ino)
			binary.LittleEndian.PutUint16(e[4:], uint16(need))
			e[6] = byte(len(name))
			e[7] = ft
			copy(e[8:], name)
			last = len(cur)
			cur = append(cur, e...)
		}
		add(in.ino, ".", 2)
		add(in.parent, "..", 2)
		for _, e := range in.n.Entries {
			c := w.byNode[e.Node]
			add(c.ino, e.Name, fileType(e.Node.Type))
		}
		binary.LittleEndian.PutUint16(cur[last+4:], uint16(blockSize-last))
		cur = append(cur, make([]byte, blockSize-len(cur))...)
		blocks = append(blocks, cur...)
		in.data = blocks
	}
	return nil
}

// dataBlocks is how many blocks an inode's content needs.
func dataBlocks(in *inode) uint64 {
	switch in.n.Type {
	case TypeDir:
		return uint64(len(in.data) / blockSize)
	case TypeFile:
		return uint64((in.n.Size + blockSize - 1) / blockSize)
	case TypeSymlink:
		if len(in.n.Target) < 60 {
			return 0
		}
		return 1
	}
	return 0
}

// isBackupGroup reports whether group g holds a superblock backup.
func isBackupGroup(g uint64) bool {
	if g <= 1 {
		return true
	}
	for _, b := range []uint64{3, 5, 7} {
		p := b
		for p < g {
			p *= b
		}
		if p == g {
			return true
		}
	}
	return false
}

// layout sizes the file system and allocates every block.
func (w *writer) layout() error {
	var data, maxExt uint64
	for _, in := range w.inodes {
		if in == nil {
			continue
		}
		in.nblk = dataBlocks(in)
		data += in.nblk
		// Each backup region a file crosses splits it; extents are at most
		// 32768 blocks: leave room for extent leaves.
		if e := in.nblk/maxExtentLen + 2; in.nblk > 0 && e > 4 {
			maxExt += e/340 + 1
		}
	}
	ninodes := uint64(len(w.inodes)) + w.opts.FreeInodes
	want := data + maxExt + w.opts.FreeBlocks
	// Iterate: metadata depends on the group count, which depends on the
	// total.
	w.groups = 1
	for i := 0; i < 64; i++ {
		ipg := (ninodes + w.groups - 1) / w.groups
		ipg = (ipg + inodesPerBlock - 1) / inodesPerBlock * inodesPerBlock
		if ipg < inodesPerBlock {
			ipg = inodesPerBlock
		}
		if ipg > blocksPerGroup {
			w.groups++
			continue
		}
		itb := ipg * inodeSize / blockSize
		gdt := (w.groups*descSize + blockSize - 1) / blockSize
		var backups uint64
		for g := uint64(1); g < w.groups; g++ {
			if isBackupGroup(g) {
				backups++
			}
		}
		meta := 1 + gdt + w.groups*(2+itb) + backups*(1+gdt)
		total := meta + want
		if total < 64 {
			total = 64
		}
		groups := (total + blocksPerGroup - 1) / blocksPerGroup
		// The last group must be able to hold its own backup.
		if groups == w.groups {
			w.total, w.ipg, w.itb, w.gdtBlk = total, uint32(ipg), itb, gdt
			break
		}
		w.groups = groups
	}
	if w.total == 0 {
		return fmt.Errorf("%w: cannot lay out %d inodes and %d blocks", ErrTree, ninodes, want)
	}
	if w.total > 1<<32-1 {
		return fmt.Errorf("%w: the image would exceed 16 TiB", ErrTree)
	}
	// A short last group gets some room: the kernel and e2fsck want a
	// group to hold more than its own backup superblock.
	if g := w.groups - 1; g > 0 && w.total-g*blocksPerGroup < 256 {
		w.total = g*blocksPerGroup + 256
	}
	w.used = make([]bool, w.total)
	// Superblock and descriptors with their backups.
	for g := uint64(0); g < w.groups; g++ {
		if isBackupGroup(g) {
			for b := uint64(0); b < 1+w.gdtBlk; b++ {
				w.used[g*blocksPerGroup+b] = true
			}
		}
	}
	// Bitmaps and inode tables (flex_bg: anywhere), from the start, each
	// table contiguous, around the backup superblocks.
	w.next = 1 + w.gdtBlk
	w.bb, w.ib, w.it = make([]uint64, w.groups), make([]uint64, w.groups), make([]uint64, w.groups)
	var err error
	for g := range w.bb {
		if w.bb[g], err = w.allocContig(1); err != nil {
			return err
		}
	}
	for g := range w.ib {
		if w.ib[g], err = w.allocContig(1); err != nil {
			return err
		}
	}
	for g := range w.it {
		if w.it[g], err = w.allocContig(w.itb); err != nil {
			return err
		}
	}
	// Data, in inode order.
	for _, in := range w.inodes {
		if in == nil || in.nblk == 0 {
			continue
		}
		var logical uint64
		for logical < in.nblk {
			start, n, err := w.alloc(in.nblk - logical)
			if err != nil {
				return fmt.Errorf("%w: %s", err, in.path)
			}
			in.extent = append(in.extent, extent{logical: uint32(logical), start: start, length: uint32(n)})
			logical += n
		}
		if len(in.extent) > 4 {
			nl := (len(in.extent) + 339) / 340
			if nl > 4 {
				return fmt.Errorf("%w: %s: too fragmented", ErrTree, in.path)
			}
			for i := 0; i < nl; i++ {
				b, _, err := w.alloc(1)
				if err != nil {
					return err
				}
				in.leaves = append(in.leaves, b)
			}
		}
	}
	return nil
}

// allocContig takes exactly n contiguous free blocks from the cursor on.
func (w *writer) allocContig(n uint64) (uint64, error) {
	for {
		for w.next < w.total && w.used[w.next] {
			w.next++
		}
		start := w.next
		end := start
		for end < w.total && end-start < n && !w.used[end] {
			end++
		}
		if end-start == n {
			for b := start; b < end; b++ {
				w.used[b] = true
			}
			w.next = end
			return start, nil
		}
		if end >= w.total {
			return 0, errors.New("ext4: no room for the metadata (layout bug)")
		}
		w.next = end
	}
}

// alloc takes up to n contiguous free blocks from the cursor.
func (w *writer) alloc(n uint64) (start, got uint64, err error) {
	for w.next < w.total && w.used[w.next] {
		w.next++
	}
	if w.next >= w.total {
		return 0, 0, errors.New("ext4: out of space (layout bug)")
	}
	start = w.next
	for got < n && got < maxExtentLen && w.next < w.total && !w.used[w.next] {
		w.used[w.next] = true
		w.next++
		got++
	}
	return start, got, nil
}

// write writes everything.
func (w *writer) write(f *os.File) error {
	// Contents first (they are the bulk), then metadata.
	buf := make([]byte, 1<<20)
	for _, in := range w.inodes {
		if in == nil || in.nblk == 0 {
			continue
		}
		switch in.n.Type {
		case TypeDir:
			if err := w.writeExtents(f, in, in.data); err != nil {
				return err
			}
		case TypeSymlink:
			blk := make([]byte, blockSize)
			copy(blk, in.n.Target)
			if err := w.writeExtents(f, in, blk); err != nil {
				return err
			}
		case TypeFile:
			if err := w.copyFile(f, in, buf); err != nil {
				return err
			}
		}
		if len(in.leaves) > 0 {
			if err := w.writeLeaves(f, in); err != nil {
				return err
			}
		}
	}
	return w.writeMeta(f)
}

func (w *writer) writeExtents(f *os.File, in *inode, data []byte) error {
	for _, e := range in.extent {
		off := uint64(e.logical) * blockSize
		end := off + uint64(e.length)*blockSize
		if end > uint64(len(data)) {
			end = uint64(len(data))
		}
		if _, err := f.WriteAt(data[off:end], int64(e.start*blockSize)); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) copyFile(f *os.File, in *inode, buf []byte) error {
	r, err := in.n.Open()
	if err != nil {
		return fmt.Errorf("ext4: %s: %w", in.path, err)
	}
	defer r.Close()
	remaining := in.n.Size
	for _, e := range in.extent {
		ext := int64(e.length) * blockSize
		if ext > remaining {
			ext = remaining
		}
		ow := io.NewOffsetWriter(f, int64(e.start*blockSize))
		n, err := io.CopyBuffer(ow, io.LimitReader(r, ext), buf)
		if err != nil {
			return fmt.Errorf("ext4: %s: %w", in.path, err)
		}
		if n != ext {
			return fmt.Errorf("%w: %s: content is %d bytes, its size says %d", ErrTree, in.path, in.n.Size-remaining+n, in.n.Size)
		}
		remaining -= n
	}
	var one [1]byte
	if n, _ := io.ReadFull(r, one[:]); n != 0 {
		return fmt.Errorf("%w: %s: content is longer than its size (%d bytes)", ErrTree, in.path, in.n.Size)
	}
	return nil
}

// writeLeaves writes the extent leaf blocks of a depth-1 tree.
func (w *writer) writeLeaves(f *os.File, in *inode) error {
	for i, b := range in.leaves {
		lo := i * 340
		hi := lo + 340
		if hi > len(in.extent) {
			hi = len(in.extent)
		}
		blk := make([]byte, blockSize)
		extentHeader(blk, hi-lo, 340, 0)
		for j, e := range in.extent[lo:hi] {
			putExtent(blk[12+12*j:], e)
		}
		if _, err := f.WriteAt(blk, int64(b*blockSize)); err != nil {
			return err
		}
	}
	return nil
}

func extentHeader(b []byte, entries, max, depth int) {
	binary.LittleEndian.PutUint16(b[0:], 0xF30A)
	binary.LittleEndian.PutUint16(b[2:], uint16(entries))
	binary.LittleEndian.PutUint16(b[4:], uint16(max))
	binary.LittleEndian.PutUint16(b[6:], uint16(depth))
}

func putExtent(b []byte, e extent) {
	binary.LittleEndian.PutUint32(b[0:], e.logical)
	binary.LittleEndian.PutUint16(b[4:], uint16(e.length))
	binary.LittleEndian.PutUint16(b[6:], uint16(e.start>>32))
	binary.LittleEndian.PutUint32(b[8:], uint32(e.start))
}

// writeMeta writes the inode tables, bitmaps, descriptors and superblocks.
func (w *writer) writeMeta(f *os.File) error {
	groups := w.groups
	freeBlocks := make([]uint64, groups)
	freeInodes := make([]uint32, groups)
	usedDirs := make([]uint32, groups)
	// Block bitmaps.
	for g := uint64(0); g < groups; g++ {
		bm := make([]byte, blockSize)
		first := g * blocksPerGroup
		for i := uint64(0); i < blocksPerGroup; i++ {
			b := first + i
			if b >= w.total || w.used[b] {
				bm[i/8] |= 1 << (i % 8)
				continue
			}
			freeBlocks[g]++
		}
		if _, err := f.WriteAt(bm, int64(w.bb[g]*blockSize)); err != nil {
			return err
		}
	}
	// Inode tables and bitmaps.
	nino := uint32(len(w.inodes))
	for g := uint64(0); g < groups; g++ {
		bm := make([]byte, blockSize)
		// Made only for a group that holds an inode: a large, mostly empty
		// file system (a session's scratch disk) has hundreds of MB of
		// zero inode tables, which stay holes.
		var table []byte
		for i := uint32(0); i < w.ipg; i++ {
			ino := uint32(g)*w.ipg + i + 1
			if ino > nino {
				freeInodes[g]++
				continue
			}
			bm[i/8] |= 1 << (i % 8)
			in := w.inodes[ino-1]
			if in == nil {
				continue // reserved: zero
			}
			if in.n.Type == TypeDir {
				usedDirs[g]++
			}
			if table == nil {
				table = make([]byte, w.itb*blockSize)
			}
			if err := w.encodeInode(table[i*inodeSize:(i+1)*inodeSize], in); err != nil {
				return err
			}
		}
		// Padding bits past the group's inodes are set.
		for i := w.ipg; i < blockSize*8; i++ {
			bm[i/8] |= 1 << (i % 8)
		}
		if _, err := f.WriteAt(bm, int64(w.ib[g]*blockSize)); err != nil {
			return err
		}
		if table != nil && !allZero(table) {
			if _, err := f.WriteAt(table, int64(w.it[g]*blockSize)); err != nil {
				return err
			}
		}
	}
	// Group descriptors.
	gdt := make([]byte, w.gdtBlk*blockSize)
	var totalFreeBlocks uint64
	var totalFreeInodes uint64
	for g := uint64(0); g < groups; g++ {
		d := gdt[g*descSize:]
		binary.LittleEndian.PutUint32(d[0:], uint32(w.bb[g]))
		binary.LittleEndian.PutUint32(d[4:], uint32(w.ib[g]))
		binary.LittleEndian.PutUint32(d[8:], uint32(w.it[g]))
		binary.LittleEndian.PutUint16(d[12:], uint16(freeBlocks[g]))
		binary.LittleEndian.PutUint16(d[14:], uint16(freeInodes[g]))
		binary.LittleEndian.PutUint16(d[16:], uint16(usedDirs[g]))
		totalFreeBlocks += freeBlocks[g]
		totalFreeInodes += uint64(freeInodes[g])
	}
	for g := uint64(0); g < groups; g++ {
		if !isBackupGroup(g) {
			continue
		}
		sb := w.superblock(totalFreeBlocks, totalFreeInodes, uint16(g))
		base := int64(g * blocksPerGroup * blockSize)
		sbOff := base
		if g == 0 {
			sbOff = 1024
		}
		if _, err := f.WriteAt(sb, sbOff); err != nil {
			return err
		}
		if _, err := f.WriteAt(gdt, base+blockSize); err != nil {
			return err
		}
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// superblock encodes the 1024-byte superblock.
func (w *writer) superblock(freeBlocks, freeInodes uint64, group uint16) []byte {
	b := make([]byte, 1024)
	le := binary.LittleEndian
	t := uint32(w.opts.Time.Unix())
	le.PutUint32(b[0x00:], w.ipg*uint32(w.groups))
	le.PutUint32(b[0x04:], uint32(w.total))
	le.PutUint32(b[0x0C:], uint32(freeBlocks))
	le.PutUint32(b[0x10:], uint32(freeInodes))
	le.PutUint32(b[0x14:], 0) // first data block
	le.PutUint32(b[0x18:], 2) // log block size: 4096
	le.PutUint32(b[0x1C:], 2) // log cluster size
	le.PutUint32(b[0x20:], blocksPerGroup)
	le.PutUint32(b[0x24:], blocksPerGroup)
	le.PutUint32(b[0x28:], w.ipg)
	le.PutUint32(b[0x30:], t) // wtime
	le.PutUint16(b[0x36:], 0xFFFF)
	le.PutUint16(b[0x38:], 0xEF53)
	le.PutUint16(b[0x3A:], 1) // clean
	le.PutUint16(b[0x3C:], 1) // errors: continue
	le.PutUint32(b[0x40:], t) // lastcheck
	le.PutUint32(b[0x4C:], 1) // dynamic revision
	le.PutUint32(b[0x54:], firstIno)
	le.PutUint16(b[0x58:], inodeSize)
	le.PutUint16(b[0x5A:], group)
	compat := uint32(0)
	if w.hasXatt {
		compat |= compatExtAttr
	}
	le.PutUint32(b[0x5C:], compat)
	le.PutUint32(b[0x60:], incompatFiletype|incompatExtents|incompatFlexBG)
	ro := uint32(roCompatSparse | roCompatDirNlink | roCompatExtraSize)
	if w.large {
		ro |= roCompatLargeFile
	}
	le.PutUint32(b[0x64:], ro)
	copy(b[0x68:0x78], w.opts.UUID[:])
	copy(b[0x78:0x88], w.opts.Label)
	le.PutUint32(b[0x108:], t) // mkfs time
	le.PutUint16(b[0x15C:], extraIsize)
	le.PutUint16(b[0x15E:], extraIsize)
	// One flex group over all groups: their metadata is in group 0.
	var lg byte
	for uint64(1)<<lg < w.groups {
		lg++
	}
	b[0x174] = lg
	return b
}

// encodeInode writes one inode.
func (w *writer) encodeInode(b []byte, in *inode) error {
	le := binary.LittleEndian
	n := in.n
	mode := uint16(n.Meta.Mode.Perm())
	if n.Meta.Mode&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if n.Meta.Mode&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if n.Meta.Mode&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	var size uint64
	links := in.links
	flags := uint32(0)
	switch n.Type {
	case TypeFile:
		mode |= 0o100000
		size = uint64(n.Size)
	case TypeDir:
		mode |= 0o040000
		size = uint64(len(in.data))
		links = 2 + in.dirs
		if in.ino == rootIno {
			links = 2 + in.dirs
		}
		if links > maxLinks {
			links = 1
		}
	case TypeSymlink:
		mode |= 0o120000
		size = uint64(len(n.Target))
	case TypeCharDev:
		mode |= 0o020000
	case TypeBlockDev:
		mode |= 0o060000
	case TypeFIFO:
		mode |= 0o010000
	case TypeSocket:
		mode |= 0o140000
	}
	if links > maxLinks {
		return fmt.Errorf("%w: %s has %d links, more than %d", ErrTree, in.path, links, maxLinks)
	}
	le.PutUint16(b[0x00:], mode)
	le.PutUint16(b[0x02:], uint16(n.Meta.UID))
	le.PutUint32(b[0x04:], uint32(size))
	sec, nsec := timeParts(n.Meta.ModTime, w.opts.Time)
	le.PutUint32(b[0x08:], sec) // atime
	le.PutUint32(b[0x0C:], sec) // ctime
	le.PutUint32(b[0x10:], sec) // mtime
	le.PutUint16(b[0x18:], uint16(n.Meta.GID))
	le.PutUint16(b[0x1A:], uint16(links))
	nblocks := in.nblk + uint64(len(in.leaves))
	le.PutUint32(b[0x1C:], uint32(nblocks*(blockSize/512)))
	le.PutUint16(b[0x74:], uint16(nblocks*(blockSize/512)>>32))
	le.PutUint32(b[0x6C:], uint32(size>>32))
	le.PutUint16(b[0x78:], uint16(n.Meta.UID>>16))
	le.PutUint16(b[0x7A:], uint16(n.Meta.GID>>16))
	iblock := b[0x28 : 0x28+60]
	switch {
	case n.Type == TypeSymlink && len(n.Target) < 60:
		copy(iblock, n.Target)
	case n.Type == TypeCharDev || n.Type == TypeBlockDev:
		if n.Major < 256 && n.Minor < 256 {
			le.PutUint32(iblock[0:], n.Major<<8|n.Minor)
		} else {
			le.PutUint32(iblock[4:], (n.Minor&0xff)|(n.Major<<8)|((n.Minor&^0xff)<<12))
		}
	case n.Type == TypeFile || n.Type == TypeDir || n.Type == TypeSymlink:
		flags |= extentsFlag
		if len(in.leaves) == 0 {
			extentHeader(iblock, len(in.extent), 4, 0)
			for j, e := range in.extent {
				putExtent(iblock[12+12*j:], e)
			}
		} else {
			extentHeader(iblock, len(in.leaves), 4, 1)
			for j, leaf := range in.leaves {
				x := iblock[12+12*j:]
				le.PutUint32(x[0:], in.extent[j*340].logical)
				le.PutUint32(x[4:], uint32(leaf))
				le.PutUint16(x[8:], uint16(leaf>>32))
			}
		}
	}
	le.PutUint32(b[0x20:], flags)
	// Extra fields.
	le.PutUint16(b[0x80:], extraIsize)
	le.PutUint32(b[0x84:], nsec) // ctime extra
	le.PutUint32(b[0x88:], nsec) // mtime extra
	le.PutUint32(b[0x8C:], nsec) // atime extra
	le.PutUint32(b[0x90:], sec)  // crtime
	le.PutUint32(b[0x94:], nsec)
	if in.xattr != nil {
		area := b[128+extraIsize:]
		le.PutUint32(area[0:], 0xEA020000)
		copy(area[4:], in.xattr)
	}
	return nil
}

// timeParts splits t (zero: def) into ext4's seconds and extra fields.
func timeParts(t, def time.Time) (sec, extra uint32) {
	if t.IsZero() {
		t = def
	}
	s := t.Unix()
	ep := uint32((s - int64(int32(s))) >> 32 & 3)
	return uint32(int32(s)), uint32(t.Nanosecond())<<2 | ep
}

// xattrSpace is the room for in-inode xattrs after the magic.
const xattrSpace = inodeSize - 128 - extraIsize - 4

var xattrPrefixes = []struct {
	prefix string
	index  byte
}{
	{"user.", 1}, {"system.posix_acl_access", 2}, {"system.posix_acl_default", 3},
	{"trusted.", 4}, {"security.", 6}, {"system.", 7},
}

// encodeXattrs encodes xattrs for the inode body (after the 4-byte
// magic): entries, a zero terminator, values at the end.
func encodeXattrs(x map[string]string) ([]byte, error) {
	names := make([]string, 0, len(x))
	for k := range x {
		names = append(names, k)
	}
	sort.Strings(names)
	type ent struct {
		idx   byte
		name  string
		value string
	}
	var ents []ent
	for _, k := range names {
		var e ent
		found := false
		for _, p := range xattrPrefixes {
			if strings.HasPrefix(k, p.prefix) {
				e = ent{idx: p.index, name: strings.TrimPrefix(k, p.prefix), value: x[k]}
				found = true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("xattr %q: unsupported namespace", k)
		}
		if len(e.name) > 255 {
			return nil, fmt.Errorf("xattr %q: name too long", k)
		}
		ents = append(ents, e)
	}
	sort.SliceStable(ents, func(i, j int) bool {
		if ents[i].idx != ents[j].idx {
			return ents[i].idx < ents[j].idx
		}
		if len(ents[i].name) != len(ents[j].name) {
			return len(ents[i].name) < len(ents[j].name)
		}
		return ents[i].name < ents[j].name
	})
	var head int
	var vals int
	for _, e := range ents {
		head += (16 + len(e.name) + 3) &^ 3
		vals += (len(e.value) + 3) &^ 3
	}
	if head+4+vals > xattrSpace {
		return nil, fmt.Errorf("xattrs take %d bytes, more than the %d an inode holds", head+4+vals, xattrSpace)
	}
	b := make([]byte, xattrSpace)
	off := 0
	vend := xattrSpace
	for _, e := range ents {
		vlen := (len(e.value) + 3) &^ 3
		vend -= vlen
		copy(b[vend:], e.value)
		b[off] = byte(len(e.name))
		b[off+1] = e.idx
		binary.LittleEndian.PutUint16(b[off+2:], uint16(vend))
		binary.LittleEndian.PutUint32(b[off+8:], uint32(len(e.value)))
		copy(b[off+16:], e.name)
		off += (16 + len(e.name) + 3) &^ 3
	}
	return b, nil
}
