//! Where an operation's operands are: views into the step program's live allocations, so that
//! the compute takes no device memory the program does not hold. Pure: nothing here touches
//! CUDA.
//!
//! - A tensor is read from the allocation the program's load made for it (matched in order,
//!   `Planner::held`), or else from its unit's weights live now (the copies accelerate
//!   streams to an offloaded unit, a ZeRO-3 gather, the largest of them).
//! - A gradient or an optimizer state is in its unit's live gradient or optimizer allocation, at
//!   its place among the unit's trainable tensors (the start where that passes the end).
//! - Activations are the live activations, logits and KV caches on the operation's device: each
//!   activation operand gets a disjoint share of one of them, the largest operands the most room.
//!   Attention's keys and values in inference are the two halves of the unit's KV cache.
//! - A copy at a device boundary reads and writes the running unit's handoff allocations.
//!
//! Each named operand's allocation must be on the operation's device (PyTorch's rule: the first
//! one elsewhere stops the run). Then the operation is tiled: its dims are halved, in its split
//! order, until every operand fits its view (and a GEMM's dims fit an `int`); each tile is the
//! real kernel at those dims over compact prefixes of the same views (the contents are random,
//! so tiles reuse them). An operation with nowhere to put an operand is skipped, with the reason.

use super::ops::{GEMM_DIM_LIMIT, Operation, Source, Work};
use super::plan::Planner;
use std::collections::{BTreeMap, HashMap};
use vramplan_sim::program::{AllocId, Component};

/// A live allocation of the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    pub device: u32,
    pub unit: Option<usize>,
    pub component: Component,
    /// Bytes requested.
    pub bytes: u64,
}

/// An operand's place: `room` bytes from `offset` in allocation `alloc` on `device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View {
    pub alloc: AllocId,
    pub device: u32,
    pub offset: u64,
    pub room: u64,
}

/// How an operation binds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Binding {
    /// Its views (one per operand) and the largest tile that fits them.
    Ready { views: Vec<View>, tile: Vec<u64> },
    /// An operand (by index) lives on another GPU than the operation's.
    Mismatch { operand: usize, device: u32 },
    /// It cannot run without memory the program does not hold here.
    Skipped(String),
}

/// What is live when an operation runs.
pub(crate) struct Moment<'l> {
    pub live: &'l BTreeMap<AllocId, Live>,
    /// The first allocation of the current span (ids are handed out in order).
    pub span_first: AllocId,
    /// The unit running.
    pub unit: Option<usize>,
}

/// Each tensor's allocation from the program's load, where the load's allocations of its unit
/// match the unit's tensors one to one.
pub(crate) struct Holdings<'p, 'a> {
    pub planner: &'p Planner<'a>,
    pub loaded: &'p HashMap<String, AllocId>,
}

const ALIGN: u64 = 256;

impl Holdings<'_, '_> {
    /// Binds `op` at `moment`.
    pub(crate) fn bind(&self, op: &Operation, moment: &Moment) -> Binding {
        if op.dims.contains(&0) {
            return Binding::Skipped("it has no work (a dim of 0)".into());
        }
        let mut views: Vec<Option<View>> = vec![None; op.operands.len()];
        let mut scratch: Vec<usize> = Vec::new();
        for (i, operand) in op.operands.iter().enumerate() {
            let placed = match &operand.source {
                Source::Scratch => {
                    scratch.push(i);
                    continue;
                }
                Source::KvCache(half) => {
                    match self.unit_alloc(moment, moment.unit, Component::KvCache, None, false) {
                        Some(id) => Ok((id, u64::from(*half) * (moment.live[&id].bytes / 2))),
                        None => {
                            scratch.push(i);
                            continue;
                        }
                    }
                }
                Source::Tensor(path) => self.tensor(path, moment),
                Source::Gradient(path) => self.trained(path, None, moment),
                Source::State(path, n) => self.trained(path, Some(*n), moment),
                Source::Handoff(device) => self
                    .unit_alloc(moment, moment.unit, Component::Activations, Some(*device), true)
                    .map(|id| (id, 0))
                    .ok_or_else(|| format!("no hidden states are in flight to cuda:{device}")),
            };
            let (alloc, offset) = match placed {
                Ok(placed) => placed,
                Err(reason) => return Binding::Skipped(reason),
            };
            let live = moment.live[&alloc];
            let checked = !matches!(operand.source, Source::Handoff(_));
            if checked && live.device != op.device {
                return Binding::Mismatch { operand: i, device: live.device };
            }
            let offset = if offset.saturating_add(4) > live.bytes { 0 } else { offset / ALIGN * ALIGN };
            // The keys stop where the values start.
            let end = if matches!(operand.source, Source::KvCache(0)) {
                live.bytes / 2 / ALIGN * ALIGN
            } else {
                live.bytes
            };
            views[i] = Some(View { alloc, device: live.device, offset, room: end.saturating_sub(offset) });
        }
        if !scratch.is_empty() {
            let taken: Vec<AllocId> = views.iter().flatten().map(|v| v.alloc).collect();
            let mut pool: Vec<(AllocId, Live)> = moment
                .live
                .iter()
                .filter(|(id, l)| {
                    l.device == op.device
                        && matches!(
                            l.component,
                            Component::Activations | Component::Logits | Component::KvCache
                        )
                        && !taken.contains(id)
                })
                .map(|(id, l)| (*id, *l))
                .collect();
            if pool.is_empty() {
                return Binding::Skipped(format!("no activation memory is live on cuda:{} here", op.device));
            }
            pool.sort_by_key(|(id, l)| (std::cmp::Reverse(l.bytes), *id));
            let sizes: Vec<u64> = scratch.iter().map(|i| op.operands[*i].bytes(&op.dims)).collect();
            for (i, view) in scratch.iter().zip(share(&pool, &sizes)) {
                views[*i] = Some(view);
            }
        }
        let views: Vec<View> = views.into_iter().map(|v| v.expect("every operand placed")).collect();
        let rooms: Vec<u64> = views.iter().map(|v| v.room).collect();
        let limit = matches!(op.work, Work::Gemm(_)).then_some(GEMM_DIM_LIMIT);
        match fit(op, &rooms, limit) {
            Some(tile) => Binding::Ready { views, tile },
            None => Binding::Skipped("an operand does not fit its view even at one row".into()),
        }
    }

    /// A tensor's allocation: its own from the load, else by its place among the unit's
    /// weights allocated in this span (streamed copies), else the unit's largest live weights.
    fn tensor(&self, path: &str, moment: &Moment) -> Result<(AllocId, u64), String> {
        let Some(&owner) = self.planner.owner.get(path) else {
            return Err(format!("{path} is held by no unit of the program"));
        };
        if let Some(id) = self.loaded.get(path).filter(|id| moment.live.contains_key(id)) {
            return Ok((*id, 0));
        }
        let owned: Vec<(AllocId, Live)> = moment
            .live
            .iter()
            .filter(|(_, l)| l.unit == Some(owner) && l.component == Component::Weights)
            .map(|(id, l)| (*id, *l))
            .collect();
        let streamed: Vec<AllocId> =
            owned.iter().filter(|(id, _)| *id >= moment.span_first).map(|(id, _)| *id).collect();
        let held = &self.planner.held[owner];
        if streamed.len() == held.len()
            && let Some(i) = held.iter().position(|p| p == path)
        {
            return Ok((streamed[i], 0));
        }
        owned
            .iter()
            .max_by_key(|(id, l)| (l.bytes, std::cmp::Reverse(*id)))
            .map(|(id, _)| (*id, 0))
            .or_else(|| {
                self.unit_alloc(moment, moment.unit, Component::Weights, None, false).map(|id| (id, 0))
            })
            .ok_or_else(|| format!("the weights of {path} are on no GPU here"))
    }

    /// A trainable tensor's gradient (`state` `None`) or optimizer state: in its unit's live
    /// allocation at its place, else in the running unit's (a tied weight's gradient the head
    /// holds until the embedding's backward).
    fn trained(&self, path: &str, state: Option<u8>, moment: &Moment) -> Result<(AllocId, u64), String> {
        let component = if state.is_some() { Component::Optimizer } else { Component::Gradients };
        let owner = self.planner.owner.get(path).copied();
        let what = if state.is_some() { "optimizer state" } else { "gradient" };
        if let Some(u) = owner
            && let Some(id) = self.unit_alloc(moment, Some(u), component, None, false)
        {
            let list = &self.planner.trainable[u];
            let before: u64 = list.iter().take_while(|(p, _)| p != path).map(|(_, n)| n).sum();
            let total: u64 = list.iter().map(|(_, n)| n).sum();
            let elements = before + u64::from(state.unwrap_or(0)) * total;
            return Ok((id, elements.saturating_mul(self.planner.train.bytes())));
        }
        self.unit_alloc(moment, moment.unit, component, None, false)
            .map(|id| (id, 0))
            .ok_or_else(|| format!("no {what} of {path} is held on a GPU here"))
    }

    /// The largest live allocation of `unit` and `component` (on `device`; of this span).
    fn unit_alloc(
        &self,
        moment: &Moment,
        unit: Option<usize>,
        component: Component,
        device: Option<u32>,
        this_span: bool,
    ) -> Option<AllocId> {
        moment
            .live
            .iter()
            .filter(|(id, l)| {
                unit.is_some()
                    && l.unit == unit
                    && l.component == component
                    && device.is_none_or(|d| l.device == d)
                    && (!this_span || **id >= moment.span_first)
            })
            .max_by_key(|(id, l)| (l.bytes, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id)
    }
}

/// Disjoint shares of `pool` (largest first) for operands of `sizes`: each operand, largest
/// first, to the allocation with the most room per byte asked of it; within an allocation, each
/// its size up to 256 bytes, and the rest in proportion to the sizes, aligned to 16.
fn share(pool: &[(AllocId, Live)], sizes: &[u64]) -> Vec<View> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|i| (std::cmp::Reverse(sizes[*i]), *i));
    let mut load = vec![0u128; pool.len()];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); pool.len()];
    for i in order {
        let z = u128::from(sizes[i].max(1));
        // The most room per byte: bytes / (load + z), compared without dividing.
        let best = (0..pool.len())
            .max_by(|a, b| {
                let ra = u128::from(pool[*a].1.bytes) * (load[*b] + z);
                let rb = u128::from(pool[*b].1.bytes) * (load[*a] + z);
                ra.cmp(&rb).then(b.cmp(a))
            })
            .expect("a pool of one at least");
        load[best] += z;
        members[best].push(i);
    }
    let mut views = vec![View { alloc: 0, device: 0, offset: 0, room: 0 }; sizes.len()];
    let least = |size: u64| size.min(ALIGN).div_ceil(16) * 16;
    for (a, (alloc, live)) in pool.iter().enumerate() {
        // Each its least room, and the rest in proportion.
        let reserved: u64 = members[a].iter().map(|i| least(sizes[*i])).sum();
        let rest = u128::from(live.bytes.saturating_sub(reserved));
        let mut offset = 0u64;
        for &i in &members[a] {
            let proportional = (rest * u128::from(sizes[i].max(1)) / load[a]) as u64 / 16 * 16;
            let room = (proportional + least(sizes[i])).min(live.bytes.saturating_sub(offset)) / 16 * 16;
            views[i] = View { alloc: *alloc, device: live.device, offset, room };
            offset += room;
        }
    }
    views
}

/// The largest tile of `op` whose operands fit `rooms`: its dims halved in its split order,
/// each time the first one that shrinks an operand that does not fit; GEMM dims at most
/// `limit`. `None` where an operand does not fit at the smallest tile.
pub(crate) fn fit(op: &Operation, rooms: &[u64], limit: Option<u64>) -> Option<Vec<u64>> {
    let mut tile = op.dims.clone();
    loop {
        let over = op.operands.iter().zip(rooms).position(|(o, room)| o.bytes(&tile) > *room);
        let shrink = match over {
            Some(i) => *op.split.iter().find(|d| op.operands[i].spans(**d) && tile[**d] > 1)?,
            None => match limit.and_then(|l| op.split.iter().find(|d| tile[**d] > l)) {
                Some(d) => *d,
                None => return Some(tile),
            },
        };
        tile[shrink] = tile[shrink].div_ceil(2);
    }
}

/// The tiles covering `dims` with tiles of at most `tile`: per dim, full chunks then the rest.
pub(crate) fn tiles(dims: &[u64], tile: &[u64]) -> impl Iterator<Item = Vec<u64>> {
    let counts: Vec<u64> = dims.iter().zip(tile).map(|(d, t)| d.div_ceil((*t).max(1))).collect();
    let total: u64 = counts.iter().product();
    let (dims, tile) = (dims.to_vec(), tile.to_vec());
    (0..total).map(move |mut n| {
        let mut out = Vec::with_capacity(dims.len());
        for d in 0..dims.len() {
            let index = n % counts[d];
            n /= counts[d];
            out.push(tile[d].min(dims[d] - index * tile[d]));
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::ops::{Elem, Gemm, GemmKind, GemmRole, Pass};

    fn linear(tokens: u64, out: u64, inp: u64) -> Operation {
        let gemm = Gemm { kind: GemmKind::Linear, role: GemmRole::Forward, trans_a: false, trans_b: true };
        let sources = [Source::Scratch, Source::Tensor("w".into()), Source::Scratch];
        Operation::gemm("l", 0, Pass::Forward, Elem::Bf16, gemm, [1, tokens, out, inp], sources, false)
    }

    #[test]
    fn tiles_cover_the_dims_exactly_once() {
        let dims = [3u64, 10, 7];
        let tile = [2u64, 4, 7];
        let all: Vec<Vec<u64>> = tiles(&dims, &tile).collect();
        assert_eq!(all.len(), 2 * 3);
        let covered: u64 = all.iter().map(|t| t.iter().product::<u64>()).sum();
        assert_eq!(covered, dims.iter().product::<u64>());
        assert!(all.iter().all(|t| t.iter().zip(&tile).all(|(a, b)| a <= b)));
    }

    /// A GEMM whose activations pass their room splits along m only; a weight that passes its
    /// allocation (a quantized one, stored in fewer bytes) splits along its own dims.
    #[test]
    fn fitting_splits_the_token_dim_first_and_stays_inside() {
        let op = linear(4096, 1024, 1024);
        let rooms = [1 << 20, 2 * 1024 * 1024, 4 << 20];
        let tile = fit(&op, &rooms, Some(GEMM_DIM_LIMIT)).unwrap();
        assert_eq!(tile, vec![1, 512, 1024, 1024]);
        assert!(op.operands.iter().zip(rooms).all(|(o, r)| o.bytes(&tile) <= r));
        // The weight in a quarter of its bf16 bytes (nf4).
        let rooms = [u64::MAX, 1024 * 1024 / 2, u64::MAX];
        let tile = fit(&op, &rooms, None).unwrap();
        assert_eq!((tile[1], tile[2] * tile[3]), (4096, 1024 * 1024 / 4));
        assert!(fit(&op, &[2, u64::MAX, u64::MAX], None).is_none(), "one element (4 bytes rounded) in 2");
        // cuBLAS's int dims.
        let huge = linear(1 << 32, 8, 8);
        assert_eq!(fit(&huge, &[u64::MAX; 3], Some(GEMM_DIM_LIMIT)).unwrap()[1], 1 << 30);
    }

    #[test]
    fn shares_are_disjoint_and_inside_their_allocations() {
        let live = |bytes| Live { device: 0, unit: None, component: Component::Activations, bytes };
        let pool = [(7, live(100_000)), (3, live(50_000))];
        let sizes = [80_000, 60_000, 4, 40_000];
        let views = share(&pool, &sizes);
        for (i, a) in views.iter().enumerate() {
            let bytes = pool.iter().find(|(id, _)| *id == a.alloc).unwrap().1.bytes;
            assert!(a.offset + a.room <= bytes && a.room > 0, "{a:?}");
            for b in &views[i + 1..] {
                assert!(a.alloc != b.alloc || a.offset + a.room <= b.offset || b.offset + b.room <= a.offset);
            }
        }
        assert_eq!(views[2].room, 16, "a 4-byte operand keeps room for itself");
    }
}
