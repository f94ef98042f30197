//! A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), so that the
//! reserve (`max_memory_reserved`) follows from the sequence of allocations rather than a factor:
//! - sizes round up to 512 bytes;
//! - requests up to 1 MiB come from the small pool, carved from 2 MiB segments;
//! - larger requests come from the large pool: a new segment is 20 MiB for requests under
//!   10 MiB, else the request rounded up to 2 MiB;
//! - a request takes the best-fitting free block of its pool (smallest that fits) and splits
//!   off the rest when at least 512 bytes (small pool) or more than 1 MiB (large pool) remain;
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

/// A block of a segment: its segment, offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Block {
    size: u64,
    segment: usize,
    offset: u64,
}

/// A pool's free blocks, ordered by (size, segment, offset): the best fit for a request is the
/// first block at least its size. A sorted list: a pool holds tens to hundreds of free blocks,
/// where a binary search and a short move beat a tree's node allocations (the replay of a
/// what-if grid spends most of its time here).
#[derive(Debug, Clone, Default)]
struct FreeBlocks(Vec<Block>);

impl FreeBlocks {
    fn best_fit(&self, size: u64) -> Option<Block> {
        let index = self.0.partition_point(|b| b.size < size);
        self.0.get(index).copied()
    }

    fn insert(&mut self, block: Block) {
        if let Err(index) = self.0.binary_search(&block) {
            self.0.insert(index, block);
        }
    }

    fn remove(&mut self, block: &Block) {
        if let Ok(index) = self.0.binary_search(block) {
            self.0.remove(index);
        }
    }

    /// Removes `old` and inserts `new`, moving only the blocks between their places.
    fn replace(&mut self, old: &Block, new: Block) {
        let Ok(from) = self.0.binary_search(old) else { return self.insert(new) };
        let to = self.0.partition_point(|b| *b < new);
        if to <= from {
            self.0[to..=from].rotate_right(1);
            self.0[to] = new;
        } else {
            self.0[from..to].rotate_left(1);
            self.0[to - 1] = new;
        }
    }
}

/// One segment obtained with `cudaMalloc`: its pool, and its blocks in order of offset
/// (offset, size, free), which tile it; no blocks once returned to the driver. A segment holds
/// a few blocks, so a sorted list beats a tree.
#[derive(Debug, Clone)]
struct Segment {
    small: bool,
    blocks: Vec<(u64, u64, bool)>,
}

impl Segment {
    /// The index of the block at `offset`.
    fn at(&self, offset: u64) -> Option<usize> {
        self.blocks.binary_search_by_key(&offset, |b| b.0).ok()
    }
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

/// The allocator's state: segments, free blocks per pool, live allocations.
#[derive(Debug, Clone)]
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
    segments: Vec<Segment>,
    /// Free blocks per pool, ordered by size for best fit.
    free: [FreeBlocks; 2],
    /// Live allocations by id (ids are handed out in sequence): (segment, offset).
    live: Vec<Option<(usize, u64)>>,
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
            free: [FreeBlocks::default(), FreeBlocks::default()],
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

    /// Returns every wholly free segment to the driver.
    fn release_cached_segments(&mut self) {
        for index in std::mem::take(&mut self.idle_list) {
            if !std::mem::take(&mut self.idle[index]) {
                continue;
            }
            let segment = &mut self.segments[index];
            if let Some(&(0, size, true)) = segment.blocks.first() {
                self.free[usize::from(segment.small)].remove(&Block { size, segment: index, offset: 0 });
                segment.blocks.clear();
                self.reserved -= size;
                if let Some(changes) = &mut self.changes {
                    changes.push(SegmentChange::Released { segment: index });
                }
            }
        }
    }

    /// Allocates `bytes` under `id`; returns the bytes charged to `allocated` (rounded).
    pub fn alloc(&mut self, id: u64, bytes: u64) -> u64 {
        let size = round(bytes);
        let small = size <= SMALL_REQUEST;
        let pool = usize::from(small);
        let block = match self.free[pool].best_fit(size) {
            Some(block) => block,
            None => {
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
                self.segments.push(Segment { small, blocks: vec![(0, segment_size, true)] });
                self.idle.push(false);
                self.reserved += segment_size;
                if let Some(changes) = &mut self.changes {
                    changes.push(SegmentChange::Created { segment, bytes: segment_size });
                }
                let block = Block { size: segment_size, segment, offset: 0 };
                self.free[pool].insert(block);
                block
            }
        };
        if let Some(idle) = self.idle.get_mut(block.segment) {
            *idle = false;
        }
        let remaining = block.size - size;
        let split = if small { remaining >= ROUND } else { remaining > SMALL_REQUEST };
        let segment = &mut self.segments[block.segment];
        let index = segment.at(block.offset).expect("a free block is in its segment");
        if split {
            segment.blocks[index] = (block.offset, size, false);
            segment.blocks.insert(index + 1, (block.offset + size, remaining, true));
            let rest = Block { size: remaining, segment: block.segment, offset: block.offset + size };
            self.free[pool].replace(&block, rest);
        } else {
            segment.blocks[index].2 = false;
            self.free[pool].remove(&block);
        }
        let charged = if split { size } else { block.size };
        let slot = id as usize;
        if self.live.len() <= slot {
            self.live.resize(slot + 1, None);
        }
        self.live[slot] = Some((block.segment, block.offset));
        self.allocated += charged;
        charged
    }

    /// Frees allocation `id`, merging with free neighbours; returns the bytes released from
    /// `allocated` (0 if unknown).
    pub fn free(&mut self, id: u64) -> u64 {
        let Some((segment, offset)) = self.live.get_mut(id as usize).and_then(Option::take) else { return 0 };
        let seg = &mut self.segments[segment];
        let pool = usize::from(seg.small);
        let Some(mut index) = seg.at(offset) else { return 0 };
        let size = seg.blocks[index].1;
        self.allocated -= size;
        let (mut start, mut length) = (offset, size);
        if let Some(&(next_offset, next_size, true)) = seg.blocks.get(index + 1)
            && next_offset == offset + size
        {
            seg.blocks.remove(index + 1);
            self.free[pool].remove(&Block { size: next_size, segment, offset: next_offset });
            length += next_size;
        }
        let mut merged_into = None;
        if let Some(&(prev_offset, prev_size, true)) = index.checked_sub(1).and_then(|i| seg.blocks.get(i))
            && prev_offset + prev_size == offset
        {
            seg.blocks.remove(index);
            index -= 1;
            merged_into = Some(Block { size: prev_size, segment, offset: prev_offset });
            start = prev_offset;
            length += prev_size;
        }
        seg.blocks[index] = (start, length, true);
        if seg.blocks.len() == 1 && !self.idle[segment] {
            self.idle[segment] = true;
            self.idle_list.push(segment);
        }
        let free = Block { size: length, segment, offset: start };
        match merged_into {
            Some(previous) => self.free[pool].replace(&previous, free),
            None => self.free[pool].insert(free),
        }
        size
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
}
