//! The replay: a [`StepProgram`] run per device through the caching-allocator model. It records
//! each device's peak of live tensors (`max_memory_allocated`) with the event where it happens
//! and the bytes by component at that moment, and the allocator's peak reserve.

use crate::allocator::CachingAllocator;
use crate::estimate::Components;
use crate::program::{Alloc, AllocId, Component, Compute, Event, Op, StepProgram};
use std::collections::BTreeMap;

/// One device's replay.
#[derive(Debug)]
struct Track {
    allocator: CachingAllocator,
    /// Bytes charged (rounded by the allocator) by component.
    by_component: [u64; 7],
    event: Event,
    peak_allocated: u64,
    peak_reserved: u64,
    peak_at: Event,
    peak_components: [u64; 7],
    /// Bytes the load placed here as weights, as requested (before the allocator rounds them).
    loaded: u64,
}

impl Clone for Track {
    fn clone(&self) -> Track {
        Track { allocator: self.allocator.clone(), ..*self }
    }

    /// Copies `source` into this track, reusing its allocator's memory.
    fn clone_from(&mut self, source: &Track) {
        self.allocator.clone_from(&source.allocator);
        self.by_component = source.by_component;
        self.event = source.event;
        self.peak_allocated = source.peak_allocated;
        self.peak_reserved = source.peak_reserved;
        self.peak_at = source.peak_at;
        self.peak_components = source.peak_components;
        self.loaded = source.loaded;
    }
}

impl Track {
    fn new(capacity: u64) -> Track {
        Track {
            allocator: CachingAllocator::with_capacity(capacity),
            by_component: [0; 7],
            event: Event::Load,
            peak_allocated: 0,
            peak_reserved: 0,
            peak_at: Event::Load,
            peak_components: [0; 7],
            loaded: 0,
        }
    }

    fn alloc(&mut self, id: AllocId, component: Component, bytes: u64, stream: u8) -> u64 {
        let charged = self.allocator.alloc_on(id as u64, bytes, stream);
        self.by_component[component.index()] += charged;
        if self.event == Event::Load && component == Component::Weights {
            self.loaded += bytes;
        }
        self.observe();
        charged
    }

    fn free(&mut self, id: AllocId, component: Component, charged: u64) {
        self.allocator.free(id as u64);
        self.by_component[component.index()] -= charged;
    }

    fn mark(&mut self, event: Event) {
        self.event = event;
        self.observe();
    }

    fn observe(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.allocator.reserved);
        if self.allocator.allocated > self.peak_allocated {
            self.peak_allocated = self.allocator.allocated;
            self.peak_at = self.event;
            self.peak_components = self.by_component;
        }
    }
}

/// What the replay found on one device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceRun {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_at: String,
    pub components: Components,
    /// Bytes still allocated at the end of the step (what stays between steps).
    pub steady: u64,
    /// Bytes in CUDA managed memory, outside the allocator (paged optimizer states).
    pub managed: u64,
    /// Bytes of the model's tensors the load placed here, as stored.
    pub loaded: u64,
}

/// What a replay found.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    /// Each used GPU's run.
    pub devices: BTreeMap<u32, DeviceRun>,
    /// Bytes each allocation was charged (by [`AllocId`]): its size rounded to 512 B, or the
    /// whole block when the allocator does not split the remainder off.
    pub charged: Vec<u64>,
}

/// Replays `program`; `capacity` gives a GPU's memory (where its allocator returns free
/// segments rather than reserve past it).
pub(crate) fn replay(program: &StepProgram, capacity: impl Fn(u32) -> u64) -> Replay {
    let mut state = ReplayState::new(program, &capacity);
    state.run(&program.ops, &capacity);
    state.finish(program)
}

/// A device's figures just after an allocation or a free on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Touched {
    pub device: u32,
    /// Bytes of live allocations (`memory_allocated`).
    pub allocated: u64,
    /// Bytes of segments (`memory_reserved`).
    pub reserved: u64,
    /// The moment the device is at.
    pub event: Event,
}

impl Touched {
    fn of(device: u32, track: &Track) -> Touched {
        Touched {
            device,
            allocated: track.allocator.allocated,
            reserved: track.allocator.reserved,
            event: track.event,
        }
    }
}

/// A replay part way through a program: every device's allocator and peaks, and the live
/// allocations. A sweep over shapes replays the load, the same at every shape, once, and goes
/// on from a copy of this for each shape.
#[derive(Debug)]
pub(crate) struct ReplayState {
    tracks: BTreeMap<u32, Track>,
    /// Live allocations by id: device, component, bytes charged.
    live: Vec<Option<(u32, Component, u64)>>,
    sizes: Vec<u64>,
}

impl Clone for ReplayState {
    fn clone(&self) -> ReplayState {
        ReplayState { tracks: self.tracks.clone(), live: self.live.clone(), sizes: self.sizes.clone() }
    }

    /// Copies `source` into this state, reusing its memory where it replays the same devices:
    /// each shape of a sweep goes on from the load in one of a few states.
    fn clone_from(&mut self, source: &ReplayState) {
        if self.tracks.keys().eq(source.tracks.keys()) {
            self.tracks.values_mut().zip(source.tracks.values()).for_each(|(t, s)| t.clone_from(s));
        } else {
            self.tracks = source.tracks.clone();
        }
        self.live.clone_from(&source.live);
        self.sizes.clone_from(&source.sizes);
    }
}

impl ReplayState {
    /// Nothing replayed yet, on the GPUs `program`'s units run on.
    pub(crate) fn new(program: &StepProgram, capacity: impl Fn(u32) -> u64) -> ReplayState {
        let mut tracks: BTreeMap<u32, Track> = BTreeMap::new();
        for device in program.units.iter().filter_map(|u| u.device) {
            tracks.entry(device).or_insert_with(|| Track::new(capacity(device)));
        }
        // (Ids are handed out in order, one per allocation: fewer than the operations.)
        let ops = program.ops.len();
        ReplayState { tracks, live: Vec::with_capacity(ops), sizes: Vec::with_capacity(ops) }
    }

    /// Replays `ops`, the next operations of the program.
    pub(crate) fn run(&mut self, ops: &[Op], capacity: impl Fn(u32) -> u64) {
        self.run_observed(ops, capacity, |_, _, _| {});
    }

    /// [`ReplayState::run`], telling `observe` after each operation its index in `ops`, the
    /// operation, and for an allocation or a free the device's figures then (for timelines; the
    /// plain replay passes a closure that does nothing, compiled away).
    pub(crate) fn run_observed(
        &mut self,
        ops: &[Op],
        capacity: impl Fn(u32) -> u64,
        mut observe: impl FnMut(usize, &Op, Option<Touched>),
    ) {
        let ReplayState { tracks, live, sizes } = self;
        for (index, op) in ops.iter().enumerate() {
            let mut touched = None;
            match *op {
                Op::Compute(Compute { device: Some(device), event, .. }) => {
                    if let Some(track) = tracks.get_mut(&device) {
                        track.mark(event);
                    }
                }
                Op::Compute(Compute { device: None, event, .. }) => {
                    tracks.values_mut().for_each(|t| t.mark(event))
                }
                Op::Alloc(Alloc { id, device, component, bytes, stream, .. }) => {
                    let track = tracks.entry(device).or_insert_with(|| Track::new(capacity(device)));
                    let charged = track.alloc(id, component, bytes, stream);
                    if live.len() <= id {
                        live.resize(id + 1, None);
                        sizes.resize(id + 1, 0);
                    }
                    live[id] = Some((device, component, charged));
                    sizes[id] = charged;
                    touched = Some(Touched::of(device, track));
                }
                Op::Free(id) => {
                    if let Some((device, component, charged)) = live.get_mut(id).and_then(Option::take)
                        && let Some(track) = tracks.get_mut(&device)
                    {
                        track.free(id, component, charged);
                        touched = Some(Touched::of(device, track));
                    }
                }
            }
            observe(index, op, touched);
        }
    }

    /// What the replay of `program` found.
    pub(crate) fn finish(self, program: &StepProgram) -> Replay {
        Replay {
            devices: self.devices(|event| program.describe(event), &program.managed_bytes),
            charged: self.sizes,
        }
    }

    /// What the replay found on each device so far, in a program whose events `describe` puts
    /// in words and which holds `managed` bytes per GPU in managed memory
    /// ([`StepProgram::managed_bytes`]).
    pub(crate) fn devices(
        &self,
        describe: impl Fn(Event) -> String,
        managed: &BTreeMap<u32, u64>,
    ) -> BTreeMap<u32, DeviceRun> {
        self.tracks
            .iter()
            .map(|(&g, t)| {
                let p = |c: Component| t.peak_components[c.index()];
                let components = Components {
                    weights: p(Component::Weights),
                    gradients: p(Component::Gradients),
                    optimizer: p(Component::Optimizer),
                    activations: p(Component::Activations),
                    kv_cache: p(Component::KvCache),
                    logits: p(Component::Logits),
                    overhead: p(Component::Workspace),
                };
                let run = DeviceRun {
                    peak_allocated: t.peak_allocated,
                    peak_reserved: t.peak_reserved,
                    peak_at: describe(t.peak_at),
                    components,
                    steady: t.by_component.iter().sum(),
                    managed: managed.get(&g).copied().unwrap_or(0),
                    loaded: t.loaded,
                };
                (g, run)
            })
            .collect()
    }
}
