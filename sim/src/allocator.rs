//! A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), so that the
//! reserve (`max_memory_reserved`) follows from the sequence of allocations rather than a factor:
//! - sizes round up to 512 bytes;
//! - requests up to 1 MiB come from the small pool, carved from 2 MiB segments;
//! - larger requests come from the large pool: a new segment is 20 MiB for requests under
//!   10 MiB, else the request rounded up to 2 MiB;
//! - a request takes the best-fitting free block of its pool (smallest that fits) and splits
//!   off the rest when at least 512 bytes (small pool) or more than 1 MiB (large pool) remain;
//! - each stream has its pools (`BlockPool` orders blocks by stream, size and address, and
//!   `get_free_block` takes only a block of the request's stream), so a block freed on one
//!   stream never serves another's request. Most programs run on one stream; FSDP1 all-gathers
//!   and reduce-scatters on streams of its own ([`CachingAllocator::alloc_on`]);
//! - a freed block merges with free neighbours in its segment; segments are kept for reuse
//!   (no `empty_cache`), except under pressure: when a new segment would take the device past
//!   its memory, the allocator first returns every wholly free segment to the driver and
//!   retries (`release_cached_blocks` in `DeviceCachingAllocator::malloc`), so fragmentation
//!   raises the reserve only where memory allows it. A request that still does not fit is an
//!   out-of-memory error; the model goes on, without further releases, and the reserve shows by
//!   how much.
//!
//! The simulator replays a step program with it; the validator (`vramplan-validate`) drives a
//! real device with it, taking each segment from the driver as the model creates it and
//! giving it back as the model releases it ([`CachingAllocator::take_segment_changes`]).

const ROUND: u64 = 512;
const SMALL_REQUEST: u64 = 1 << 20;
const SMALL_SEGMENT: u64 = 2 << 20;
const LARGE_SEGMENT: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// A block's index in [`CachingAllocator::blocks`].
type BlockIndex = u32;

/// A block of a segment, a node of the segment's list of blocks in order of offset, which tile
/// it (PyTorch's `Block` with its `prev` and `next`).
#[derive(Debug, Clone, Copy)]
struct Block {
    segment: u32,
    offset: u64,
    size: u64,
    free: bool,
    prev: Option<BlockIndex>,
    next: Option<BlockIndex>,
}

/// A free block as its pool orders it: by (size, segment, offset), PyTorch's order (size, then
/// address), and the block it is. No two free blocks share a segment and offset, so `block`
/// never decides the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FreeBlock {
    size: u64,
    segment: u32,
    offset: u64,
    block: BlockIndex,
}

/// The size class of a free block of `size` bytes (TLSF's two levels): below 16 units of 512
/// bytes, one class per size; above, each power of two of units split in 16 classes. Classes
/// are in the order of the sizes they hold.
fn size_class(size: u64) -> usize {
    let units = size / ROUND;
    if units < 16 {
        return units as usize;
    }
    let log = units.ilog2() as usize;
    16 * (log - 3) + ((units >> (log - 4)) & 15) as usize
}

/// A pool's free blocks by size class, each class in order, and which classes hold any: the
/// best fit for a request is the first block at least its size in its class, else the first
/// block of the next class that holds one. A pool holds tens to hundreds of free blocks, many
/// of one size (what is left of segments that held the same tensor of every layer); a class
/// holds few sizes, so finding, adding and removing a block searches and moves a short list
/// (the replay of a what-if grid spends most of its time here).
#[derive(Debug, Default)]
struct FreeBlocks {
    /// Free blocks by size class, each in order.
    classes: Vec<Vec<FreeBlock>>,
    /// Bit `c % 64` of word `c / 64`: class `c` holds a block.
    occupied: Vec<u64>,
}

impl Clone for FreeBlocks {
    fn clone(&self) -> FreeBlocks {
        FreeBlocks { classes: self.classes.clone(), occupied: self.occupied.clone() }
    }

    /// Copies `source` into the lists this already holds, reusing their memory (classes past
    /// `source`'s are kept, empty).
    fn clone_from(&mut self, source: &FreeBlocks) {
        let shared = self.classes.len().min(source.classes.len());
        self.classes[..shared].clone_from_slice(&source.classes[..shared]);
        self.classes[shared..].iter_mut().for_each(Vec::clear);
        self.classes.extend_from_slice(&source.classes[shared..]);
        self.occupied.clone_from(&source.occupied);
    }
}

impl FreeBlocks {
    /// The best fit for `size`, and where it is (its class and index there).
    fn best_fit(&self, size: u64) -> Option<(FreeBlock, (usize, usize))> {
        let class = size_class(size);
        if let Some(blocks) = self.classes.get(class) {
            let index = blocks.partition_point(|b| b.size < size);
            if let Some(block) = blocks.get(index) {
                return Some((*block, (class, index)));
            }
        }
        let next = self.next_occupied(class + 1)?;
        Some((*self.classes[next].first()?, (next, 0)))
    }

    /// The first class from `from` on that holds a block.
    fn next_occupied(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.occupied.get(word)? & (u64::MAX << (from % 64));
        while bits == 0 {
            word += 1;
            bits = *self.occupied.get(word)?;
        }
        Some(word * 64 + bits.trailing_zeros() as usize)
    }

    /// Where `block` is, if it is here.
    fn find(&self, block: &FreeBlock) -> Option<(usize, usize)> {
        let class = size_class(block.size);
        let index = self.classes.get(class)?.binary_search(block).ok()?;
        Some((class, index))
    }

    /// Adds `block`; returns where it is.
    fn insert(&mut self, block: FreeBlock) -> (usize, usize) {
        let class = size_class(block.size);
        if self.classes.len() <= class {
            self.classes.resize_with(class + 1, Vec::new);
        }
        if self.occupied.len() <= class / 64 {
            self.occupied.resize(class / 64 + 1, 0);
        }
        let blocks = &mut self.classes[class];
        let index = blocks.partition_point(|b| b < &block);
        blocks.insert(index, block);
        self.occupied[class / 64] |= 1 << (class % 64);
        (class, index)
    }

    /// Removes the block at `(class, index)`.
    fn remove_at(&mut self, (class, index): (usize, usize)) {
        let blocks = &mut self.classes[class];
        blocks.remove(index);
        if blocks.is_empty() {
            self.occupied[class / 64] &= !(1 << (class % 64));
        }
    }

    fn remove(&mut self, block: &FreeBlock) {
        if let Some(place) = self.find(block) {
            self.remove_at(place);
        }
    }

    /// Replaces the block at `(class, index)` with `new`: within the class, moving only the
    /// blocks between their places, where `new` is of the same class.
    fn replace_at(&mut self, (class, index): (usize, usize), new: FreeBlock) {
        if size_class(new.size) != class {
            self.remove_at((class, index));
            self.insert(new);
            return;
        }
        let blocks = &mut self.classes[class];
        if new < blocks[index] {
            let to = blocks[..index].partition_point(|b| *b < new);
            blocks.copy_within(to..index, to + 1);
            blocks[to] = new;
        } else {
            let to = index + 1 + blocks[index + 1..].partition_point(|b| *b < new);
            blocks.copy_within(index + 1..to, index);
            blocks[to - 1] = new;
        }
    }

    /// Replaces `old` with `new`.
    fn replace(&mut self, old: &FreeBlock, new: FreeBlock) {
        match self.find(old) {
            Some(place) => self.replace_at(place, new),
            None => {
                self.insert(new);
            }
        }
    }
}

/// One segment obtained with `cudaMalloc`: its pool, and its block at offset 0, the head of its
/// list of blocks (blocks merge into the one before them, so the head lives as long as the
/// segment).
#[derive(Debug, Clone, Copy)]
struct Segment {
    small: bool,
    /// The stream whose pools hold its free blocks (0: the compute stream).
    stream: u8,
    first: BlockIndex,
}

/// The index of the pool of `stream`'s small (`small`) or large blocks in
/// [`CachingAllocator::free`].
fn pool_of(stream: u8, small: bool) -> usize {
    2 * usize::from(stream) + usize::from(small)
}

/// A segment the allocator took from the driver (`cudaMalloc`) or gave back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentChange {
    /// Segment `segment` (numbered in order of creation) of `bytes` was created.
    Created {
        /// The segment's number.
        segment: usize,
        /// Its size.
        bytes: u64,
    },
    /// Segment `segment` was returned to the driver.
    Released {
        /// The segment's number.
        segment: usize,
    },
}

/// The allocator's state: segments, their blocks, free blocks per pool, live allocations.
#[derive(Debug)]
pub struct CachingAllocator {
    /// The most it may reserve before it returns free segments (the device's usable memory).
    capacity: u64,
    /// Segments that may be one free block, which release would return (`idle` says which
    /// entries still are).
    idle_list: Vec<usize>,
    /// Per segment: it is one free block.
    idle: Vec<bool>,
    /// A request did not fit even after a release: PyTorch's out-of-memory error. The replay
    /// goes on to show by how much, with no further releases.
    out_of_memory: bool,
    /// Segments by number, released ones included.
    segments: Vec<Segment>,
    /// Every segment's blocks, linked in lists by segment; the entries of merged blocks and
    /// released segments are reused (`spare`).
    blocks: Vec<Block>,
    /// Entries of `blocks` no longer in use.
    spare: Vec<BlockIndex>,
    /// Free blocks per pool (each stream's large and small, [`pool_of`]), ordered by size for
    /// best fit.
    free: Vec<FreeBlocks>,
    /// Live allocations by id (ids are handed out in sequence): their block.
    live: Vec<Option<BlockIndex>>,
    /// Segment changes not yet taken, when they are recorded.
    changes: Option<Vec<SegmentChange>>,
    /// Bytes of live allocations, each as charged (rounded, or the whole unsplit block).
    pub allocated: u64,
    /// Bytes of segments held from the driver.
    pub reserved: u64,
}

fn round(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(ROUND) * ROUND
}

impl Clone for CachingAllocator {
    fn clone(&self) -> CachingAllocator {
        CachingAllocator {
            capacity: self.capacity,
            idle_list: self.idle_list.clone(),
            idle: self.idle.clone(),
            out_of_memory: self.out_of_memory,
            segments: self.segments.clone(),
            blocks: self.blocks.clone(),
            spare: self.spare.clone(),
            free: self.free.clone(),
            live: self.live.clone(),
            changes: self.changes.clone(),
            allocated: self.allocated,
            reserved: self.reserved,
        }
    }

    /// Copies `source` into the tables this already holds, reusing their memory: a sweep over
    /// shapes copies the state after the load into the same few allocators for every shape.
    fn clone_from(&mut self, source: &CachingAllocator) {
        self.capacity = source.capacity;
        self.idle_list.clone_from(&source.idle_list);
        self.idle.clone_from(&source.idle);
        self.out_of_memory = source.out_of_memory;
        self.segments.clone_from(&source.segments);
        self.blocks.clone_from(&source.blocks);
        self.spare.clone_from(&source.spare);
        self.free.clone_from(&source.free);
        self.live.clone_from(&source.live);
        self.changes.clone_from(&source.changes);
        self.allocated = source.allocated;
        self.reserved = source.reserved;
    }
}

impl Default for CachingAllocator {
    fn default() -> CachingAllocator {
        CachingAllocator::with_capacity(u64::MAX)
    }
}

impl CachingAllocator {
    /// An allocator for a device of `capacity` usable bytes.
    pub fn with_capacity(capacity: u64) -> CachingAllocator {
        CachingAllocator {
            capacity,
            idle_list: Vec::new(),
            idle: Vec::new(),
            out_of_memory: false,
            segments: Vec::new(),
            blocks: Vec::new(),
            spare: Vec::new(),
            free: vec![FreeBlocks::default(), FreeBlocks::default()],
            live: Vec::new(),
            changes: None,
            allocated: 0,
            reserved: 0,
        }
    }

    /// The same, recording every segment it creates and releases for
    /// [`CachingAllocator::take_segment_changes`].
    pub fn recording_segments(capacity: u64) -> CachingAllocator {
        CachingAllocator { changes: Some(Vec::new()), ..CachingAllocator::with_capacity(capacity) }
    }

    /// The segments created and released since the last call, in order (none unless made by
    /// [`CachingAllocator::recording_segments`]).
    pub fn take_segment_changes(&mut self) -> Vec<SegmentChange> {
        self.changes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// A new entry of `blocks` holding `block`.
    fn new_block(&mut self, block: Block) -> BlockIndex {
        match self.spare.pop() {
            Some(index) => {
                self.blocks[index as usize] = block;
                index
            }
            None => {
                self.blocks.push(block);
                BlockIndex::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
            }
        }
    }

    /// `index` as its pool orders it.
    fn free_block(&self, index: BlockIndex) -> FreeBlock {
        let b = &self.blocks[index as usize];
        FreeBlock { size: b.size, segment: b.segment, offset: b.offset, block: index }
    }

    /// Returns every wholly free segment to the driver.
    fn release_cached_segments(&mut self) {
        for index in std::mem::take(&mut self.idle_list) {
            if !std::mem::take(&mut self.idle[index]) {
                continue;
            }
            let Segment { small, stream, first } = self.segments[index];
            let head = self.blocks[first as usize];
            if head.free && head.next.is_none() {
                let block = self.free_block(first);
                self.free[pool_of(stream, small)].remove(&block);
                self.spare.push(first);
                self.reserved -= head.size;
                if let Some(changes) = &mut self.changes {
                    changes.push(SegmentChange::Released { segment: index });
                }
            }
        }
    }

    /// A new segment of `stream` for a request of `size` in the pool `small` (returning free
    /// segments first under pressure): its one block, free, and where it is in its pool's free
    /// blocks.
    fn new_segment(&mut self, size: u64, small: bool, stream: u8) -> (FreeBlock, (usize, usize)) {
        let segment_size = if small {
            SMALL_SEGMENT
        } else if size < MIN_LARGE_ALLOC {
            LARGE_SEGMENT
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        };
        if !self.out_of_memory && self.reserved.saturating_add(segment_size) > self.capacity {
            self.release_cached_segments();
            self.out_of_memory = self.reserved.saturating_add(segment_size) > self.capacity;
        }
        let segment = self.segments.len();
        let number = u32::try_from(segment).expect("fewer than 2^32 segments");
        let block =
            Block { segment: number, offset: 0, size: segment_size, free: true, prev: None, next: None };
        let first = self.new_block(block);
        self.segments.push(Segment { small, stream, first });
        self.idle.push(false);
        self.reserved += segment_size;
        if let Some(changes) = &mut self.changes {
            changes.push(SegmentChange::Created { segment, bytes: segment_size });
        }
        let free = self.free_block(first);
        (free, self.free[pool_of(stream, small)].insert(free))
    }

    /// Allocates `bytes` under `id` on the compute stream; returns the bytes charged to
    /// `allocated` (rounded).
    pub fn alloc(&mut self, id: u64, bytes: u64) -> u64 {
        self.alloc_on(id, bytes, 0)
    }

    /// Allocates `bytes` under `id` on stream `stream` (0: the compute stream), from that
    /// stream's pools only; returns the bytes charged to `allocated` (rounded).
    pub fn alloc_on(&mut self, id: u64, bytes: u64, stream: u8) -> u64 {
        let size = round(bytes);
        let small = size <= SMALL_REQUEST;
        let pool = pool_of(stream, small);
        if self.free.len() <= pool {
            self.free.resize_with(pool + 1, FreeBlocks::default);
        }
        let (found, place) = match self.free[pool].best_fit(size) {
            Some(found) => found,
            None => self.new_segment(size, small, stream),
        };
        if let Some(idle) = self.idle.get_mut(found.segment as usize) {
            *idle = false;
        }
        let remaining = found.size - size;
        let split = if small { remaining >= ROUND } else { remaining > SMALL_REQUEST };
        let block = found.block;
        if split {
            let (segment, offset) = (found.segment, found.offset + size);
            let next = self.blocks[block as usize].next;
            let rest = Block { segment, offset, size: remaining, free: true, prev: Some(block), next };
            let rest = self.new_block(rest);
            if let Some(next) = next {
                self.blocks[next as usize].prev = Some(rest);
            }
            let b = &mut self.blocks[block as usize];
            b.size = size;
            b.next = Some(rest);
            b.free = false;
            let rest = FreeBlock { size: remaining, segment, offset, block: rest };
            self.free[pool].replace_at(place, rest);
        } else {
            self.blocks[block as usize].free = false;
            self.free[pool].remove_at(place);
        }
        let charged = if split { size } else { found.size };
        let slot = id as usize;
        if self.live.len() <= slot {
            self.live.resize(slot + 1, None);
        }
        self.live[slot] = Some(block);
        self.allocated += charged;
        charged
    }

    /// Where live allocation `id` is: its segment (numbered as [`SegmentChange`] numbers
    /// them), its offset in that segment, and the bytes of its block (the request rounded up, or
    /// the whole block it did not split). `None` once it is freed. The validator points at
    /// the program's allocations with it: a segment's address plus the offset.
    pub fn place(&self, id: u64) -> Option<(usize, u64, u64)> {
        let index = (*self.live.get(usize::try_from(id).ok()?)?)?;
        let block = &self.blocks[index as usize];
        Some((block.segment as usize, block.offset, block.size))
    }

    /// Frees allocation `id`, merging with free neighbours; returns the bytes released from
    /// `allocated` (0 if unknown).
    pub fn free(&mut self, id: u64) -> u64 {
        let Some(index) = self.live.get_mut(id as usize).and_then(Option::take) else { return 0 };
        let block = self.blocks[index as usize];
        let Segment { small, stream, .. } = self.segments[block.segment as usize];
        let pool = pool_of(stream, small);
        self.allocated -= block.size;
        // The free block this becomes, and its neighbours, as the free ones merge into it: the
        // one after into this, this into the one before (whose entry it keeps). The entries of
        // blocks merged away are reused.
        let segment = block.segment;
        let mut merged = FreeBlock { size: block.size, segment, offset: block.offset, block: index };
        let (mut prev, mut next) = (block.prev, block.next);
        if let Some(after) = next
            && let Block { free: true, size, offset, next: beyond, .. } = self.blocks[after as usize]
        {
            self.free[pool].remove(&FreeBlock { size, segment, offset, block: after });
            merged.size += size;
            next = beyond;
            self.spare.push(after);
        }
        let mut merged_into = None;
        if let Some(before) = prev
            && let Block { free: true, size, offset, prev: beyond, .. } = self.blocks[before as usize]
        {
            let previous = FreeBlock { size, segment, offset, block: before };
            merged = FreeBlock { size: size + merged.size, offset, block: before, ..merged };
            prev = beyond;
            self.spare.push(index);
            merged_into = Some(previous);
        }
        // Written whole from what is known here (reading back fields just written would stall).
        self.blocks[merged.block as usize] =
            Block { segment, offset: merged.offset, size: merged.size, free: true, prev, next };
        if let Some(next) = next {
            self.blocks[next as usize].prev = Some(merged.block);
        }
        if prev.is_none() && next.is_none() && !self.idle[segment as usize] {
            self.idle[segment as usize] = true;
            self.idle_list.push(segment as usize);
        }
        match merged_into {
            Some(previous) => self.free[pool].replace(&previous, merged),
            None => {
                self.free[pool].insert(merged);
            }
        }
        block.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_requests_share_two_mib_segments() {
        let mut a = CachingAllocator::default();
        a.alloc(1, 1000);
        a.alloc(2, 1000);
        assert_eq!(a.allocated, 2 * 1024);
        assert_eq!(a.reserved, 2 * MIB);
    }

    #[test]
    fn mid_sized_requests_get_twenty_mib_segments_and_large_ones_round_to_two() {
        let mut a = CachingAllocator::default();
        a.alloc(1, 3 * MIB);
        assert_eq!(a.reserved, 20 * MIB);
        a.alloc(2, 3 * MIB); // fits in the first segment's remainder
        assert_eq!(a.reserved, 20 * MIB);
        // 14 MiB remain in that segment: an 11 MiB request is served from it, a 15 MiB one gets
        // its own segment, rounded up to 2 MiB.
        a.alloc(3, 11 * MIB);
        assert_eq!(a.reserved, 20 * MIB);
        a.alloc(4, 15 * MIB + 1);
        assert_eq!(a.reserved, 20 * MIB + 16 * MIB);
    }

    #[test]
    fn freed_neighbours_merge_and_are_reused() {
        let mut a = CachingAllocator::default();
        a.alloc(1, 40 * MIB);
        a.free(1);
        a.alloc(2, 16 * MIB);
        a.alloc(3, 16 * MIB);
        assert_eq!(a.reserved, 40 * MIB);
        a.free(2);
        a.free(3);
        a.alloc(4, 40 * MIB);
        assert_eq!(a.reserved, 40 * MIB, "merged blocks serve the full size again");
        assert_eq!(a.allocated, 40 * MIB);
    }

    #[test]
    fn fragmentation_forces_a_new_segment() {
        let mut a = CachingAllocator::default();
        for id in 0..4 {
            a.alloc(id, 20 * MIB);
        }
        a.free(0);
        a.free(2);
        // 40 MiB are free but not contiguous.
        a.alloc(9, 30 * MIB);
        assert_eq!(a.reserved, 80 * MIB + 30 * MIB);
    }

    #[test]
    fn a_block_freed_on_one_stream_serves_only_that_stream() {
        let mut a = CachingAllocator::default();
        a.alloc(1, 40 * MIB);
        a.free(1);
        a.alloc_on(2, 40 * MIB, 1);
        assert_eq!(a.reserved, 80 * MIB, "the compute stream's free block is not the other's");
        a.free(2);
        a.alloc(3, 16 * MIB);
        a.alloc_on(4, 16 * MIB, 1);
        assert_eq!(a.reserved, 80 * MIB, "each stream reuses its own");
        check(&a);
    }

    #[test]
    fn under_pressure_free_segments_are_returned_before_a_new_one() {
        let mut a = CachingAllocator::with_capacity(100 * MIB);
        for id in 0..4 {
            a.alloc(id, 20 * MIB);
        }
        a.free(0);
        a.free(2);
        // 80 MiB reserved, 40 MiB of it free in two whole segments: a 30 MiB segment would pass
        // the capacity, so both free segments go back first.
        a.alloc(9, 30 * MIB);
        assert_eq!(a.reserved, 40 * MIB + 30 * MIB);
        assert_eq!(a.allocated, 70 * MIB);
        // A request past what release can make room for is still served (the reserve shows the
        // shortfall).
        a.alloc(10, 60 * MIB);
        assert_eq!(a.reserved, 130 * MIB);
    }

    #[test]
    fn segment_changes_are_recorded_in_order() {
        let mut a = CachingAllocator::recording_segments(100 * MIB);
        for id in 0..4 {
            a.alloc(id, 20 * MIB);
        }
        a.free(0);
        a.free(2);
        a.alloc(9, 30 * MIB);
        let created = |segment| SegmentChange::Created { segment, bytes: 20 * MIB };
        assert_eq!(
            a.take_segment_changes(),
            vec![
                created(0),
                created(1),
                created(2),
                created(3),
                SegmentChange::Released { segment: 0 },
                SegmentChange::Released { segment: 2 },
                SegmentChange::Created { segment: 4, bytes: 30 * MIB },
            ]
        );
        assert!(a.take_segment_changes().is_empty());
    }

    /// Live allocations sit inside their segments, at least their request long, and never
    /// overlap; a freed one has no place.
    #[test]
    fn places_are_disjoint_and_inside_their_segments() {
        let mut a = CachingAllocator::recording_segments(u64::MAX);
        let requests = [(0, 1000), (1, 3 * MIB), (2, 700), (3, 25 * MIB), (4, 3 * MIB), (5, 512)];
        for (id, bytes) in requests {
            a.alloc(id, bytes);
        }
        a.free(1);
        a.alloc(6, 2 * MIB);
        let mut sizes = std::collections::HashMap::new();
        for change in a.take_segment_changes() {
            if let SegmentChange::Created { segment, bytes } = change {
                sizes.insert(segment, bytes);
            }
        }
        assert_eq!(a.place(1), None);
        let live: Vec<(u64, u64)> =
            requests.iter().copied().filter(|(id, _)| *id != 1).chain([(6, 2 * MIB)]).collect();
        let places: Vec<(usize, u64, u64)> = live.iter().map(|(id, _)| a.place(*id).unwrap()).collect();
        for (i, ((segment, offset, size), (_, bytes))) in places.iter().zip(&live).enumerate() {
            assert!(size >= bytes && offset + size <= sizes[segment], "{:?}", places[i]);
            for (other, o_offset, o_size) in &places[i + 1..] {
                assert!(other != segment || offset + size <= *o_offset || o_offset + o_size <= *offset);
            }
        }
        // The 2 MiB request reuses the freed 3 MiB block at its offset.
        assert_eq!(a.place(6).map(|(s, o, _)| (s, o)), Some((1, 0)));
    }

    /// Holds `a` to its own bookkeeping: each segment's blocks tile it and link both ways, with
    /// no two free blocks side by side; its pool lists exactly its free blocks, each in its class
    /// and in order; and the totals add up.
    fn check(a: &CachingAllocator) {
        let mut reserved = 0;
        let mut free: Vec<Vec<FreeBlock>> = vec![Vec::new(); a.free.len()];
        for (number, segment) in a.segments.iter().enumerate() {
            let head = a.blocks[segment.first as usize];
            if a.spare.contains(&segment.first) || head.segment as usize != number {
                continue; // returned to the driver
            }
            let (mut at, mut offset, mut prev) = (Some(segment.first), 0, None);
            while let Some(index) = at {
                let b = a.blocks[index as usize];
                assert_eq!((b.segment as usize, b.offset, b.prev), (number, offset, prev));
                assert!(!a.spare.contains(&index), "block {index} in use and spare");
                if b.free {
                    assert!(prev.is_none_or(|p| !a.blocks[p as usize].free), "free neighbours unmerged");
                    let entry =
                        FreeBlock { size: b.size, segment: b.segment, offset: b.offset, block: index };
                    free[pool_of(segment.stream, segment.small)].push(entry);
                }
                (offset, prev, at) = (offset + b.size, Some(index), b.next);
            }
            reserved += offset;
        }
        for (pool, mut expected) in a.free.iter().zip(free) {
            for (class, blocks) in pool.classes.iter().enumerate() {
                assert!(blocks.is_sorted() && blocks.iter().all(|b| size_class(b.size) == class));
                let occupied = pool.occupied.get(class / 64).is_some_and(|w| w & (1 << (class % 64)) != 0);
                assert_eq!(occupied, !blocks.is_empty(), "class {class}");
            }
            let mut listed: Vec<FreeBlock> = pool.classes.iter().flatten().copied().collect();
            listed.sort_unstable();
            expected.sort_unstable();
            assert_eq!(listed, expected);
        }
        let allocated: u64 = a.live.iter().flatten().map(|&b| a.blocks[b as usize].size).sum();
        assert_eq!((a.reserved, a.allocated), (reserved, allocated));
    }

    #[test]
    fn random_requests_keep_the_books_and_a_copy_goes_on_alike() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..30 {
            // (id, bytes): an allocation, or with no bytes the free of an earlier one.
            let mut ops: Vec<(u64, Option<u64>)> = Vec::new();
            let mut live = Vec::new();
            for id in 0..400 {
                if live.is_empty() || random() % 100 < 55 {
                    let r = random();
                    let bytes = match r % 4 {
                        0 => r >> 8 & 4095,
                        1 => (r >> 8) % (2 * MIB),
                        2 => (r >> 8) % (40 * MIB),
                        _ => ((r >> 8) % 64) * MIB,
                    };
                    ops.push((id, Some(bytes)));
                    live.push(id);
                } else {
                    let i = (random() % live.len() as u64) as usize;
                    ops.push((live.swap_remove(i), None));
                }
            }
            let apply = |a: &mut CachingAllocator, ops: &[(u64, Option<u64>)]| {
                for &(id, bytes) in ops {
                    match bytes {
                        Some(bytes) => a.alloc(id, bytes),
                        None => a.free(id),
                    };
                    check(a);
                }
            };
            let capacity = [u64::MAX, 100 * MIB, 400 * MIB][round % 3];
            let mut whole = CachingAllocator::recording_segments(capacity);
            apply(&mut whole, &ops);
            // A copy made half way into an allocator that has run other requests goes on alike.
            let (first, rest) = ops.split_at(ops.len() / 2);
            let mut half = CachingAllocator::recording_segments(capacity);
            apply(&mut half, first);
            let mut copy = CachingAllocator::with_capacity(capacity);
            apply(&mut copy, rest);
            copy.clone_from(&half);
            apply(&mut copy, rest);
            assert_eq!((copy.allocated, copy.reserved), (whole.allocated, whole.reserved));
            assert_eq!(copy.take_segment_changes(), whole.take_segment_changes());
        }
    }
}
