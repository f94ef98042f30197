//! The `cuda` backend: a step program run on real CUDA devices, its allocations and its
//! compute.
//!
//! Each plan GPU `i` is CUDA device `i`; with `fold_devices`, CUDA device `i mod n` of the `n`
//! here, so that a plan for several GPUs runs on one (each plan GPU keeps its own allocator
//! model, capacity and peaks; the driver's count is then that of the device they share). Per
//! plan GPU, the simulator's caching-allocator model
//! decides, allocation by allocation, which segments exist; every segment it creates is taken
//! from the driver with `cuMemAlloc` and every one it returns is given back with `cuMemFree`.
//! So the bytes the device holds are the bytes the prediction says PyTorch would reserve, and
//! the driver's count (`cuMemGetInfo`: total − free, as `nvidia-smi` shows it) is measured after
//! each new segment and at every event. A segment the driver refuses is the run's
//! out-of-memory: the event and device are noted, and everything taken is given back.
//!
//! Beside the allocations runs the compute (`compute.rs`): each moment of the program runs its
//! operations (`plan.rs`: cuBLAS GEMMs for the linear layers, experts and eager attention, and
//! NVRTC kernels, `kernels.rs`, for the rest; backward and the optimizer step in training; a
//! copy at each device boundary) on views into the program's live allocations (`bind.rs`), so
//! that the measured allocated and reserved bytes stay the program's. Every operation checks
//! PyTorch's device rule on its operands; a violation stops the run with the module, the
//! operation and the two devices. `engine.rs` runs them through cudarc.
//!
//! The driver, cuBLAS and NVRTC are found before cudarc is asked for them (cudarc panics where
//! one is missing): [`driver_library`] and `engine::libraries` try the names cudarc would.
//!
//! The tests (`tests.rs`) drive all of this with a fake driver and a fake engine, no GPU needed,
//! and check the kernels' syntax with a host C++ compiler; what only a GPU shows (NVRTC's own
//! compile, cuBLAS's and the kernels' behaviour, timings) they do not.

mod bind;
mod compute;
mod engine;
mod kernels;
mod ops;
mod plan;
#[cfg(test)]
mod tests;
mod walk;

use crate::{DevicePeaks, Outcome, Sample, Unavailable, Validation};
use compute::Runner;
use cudarc::driver::{CudaContext, DriverError, result, sys};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::allocator::{CachingAllocator, SegmentChange};
use vramplan_sim::program::{Alloc, AllocId, Compute, Op, StepProgram};
use vramplan_sim::workload::Workload;

/// The name of the CUDA driver library that loads here, trying the names cudarc tries.
pub(crate) fn driver_library() -> Result<String, Unavailable> {
    engine::find_library(&["cuda", "nvcuda"]).map_err(|tried| Unavailable::NoDriver { tried })
}

fn driver_failed(e: DriverError) -> Unavailable {
    Unavailable::DriverFailed { error: format!("{e:?}") }
}

/// What the run needs of a device's driver: whole segments, and its count of free memory.
/// The CUDA driver in a run; a fake of fixed size in the tests.
trait Driver {
    /// A segment of `bytes`: its address, or `None` when the driver is out of memory.
    fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, DriverError>;
    /// Gives a segment back.
    fn free(&mut self, pointer: u64) -> Result<(), DriverError>;
    /// Free and total bytes, as the driver counts them.
    fn memory(&mut self) -> Result<(u64, u64), DriverError>;
}

/// The CUDA driver of one device, through its primary context.
struct Cuda(Arc<CudaContext>);

impl Driver for Cuda {
    fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, DriverError> {
        self.0.bind_to_thread()?;
        // SAFETY: a plain device allocation in the bound context; the caller keeps the pointer
        // until it frees it once.
        match unsafe { result::malloc_sync(bytes as usize) } {
            Ok(pointer) => Ok(Some(pointer)),
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn free(&mut self, pointer: u64) -> Result<(), DriverError> {
        self.0.bind_to_thread()?;
        // SAFETY: the pointer came from `malloc` in this context and is freed once.
        unsafe { result::free_sync(pointer) }
    }

    fn memory(&mut self) -> Result<(u64, u64), DriverError> {
        self.0.bind_to_thread()?;
        let (free, total) = result::mem_get_info()?;
        Ok((free as u64, total as u64))
    }
}

/// One plan GPU while the program runs on it.
struct Device {
    driver: Box<dyn Driver>,
    allocator: CachingAllocator,
    /// Segments held from the driver, by the allocator's number.
    segments: HashMap<usize, u64>,
    peaks: DevicePeaks,
}

impl Device {
    fn new(
        index: u32,
        name: String,
        usable: u64,
        mut driver: Box<dyn Driver>,
    ) -> Result<Device, DriverError> {
        let (free, total) = driver.memory()?;
        Ok(Device {
            driver,
            allocator: CachingAllocator::recording_segments(usable),
            segments: HashMap::new(),
            peaks: DevicePeaks {
                device: index,
                name,
                allocated_bytes: 0,
                reserved_bytes: 0,
                driver_used_bytes: 0,
                driver_used_before_bytes: total.saturating_sub(free),
                peak_event: String::new(),
            },
        })
    }

    /// The driver's used bytes now, noted in the peaks at `event`.
    fn observe(&mut self, event: &str) -> Result<u64, DriverError> {
        let (free, total) = self.driver.memory()?;
        let used = total.saturating_sub(free);
        if used > self.peaks.driver_used_bytes {
            self.peaks.driver_used_bytes = used;
            self.peaks.peak_event = event.to_string();
        }
        Ok(used)
    }

    /// Takes and gives back the segments the allocator model created and released. `Ok(Some)`
    /// is the size of a segment the driver refused.
    fn apply_segment_changes(&mut self, event: &str) -> Result<Option<u64>, DriverError> {
        for change in self.allocator.take_segment_changes() {
            match change {
                SegmentChange::Created { segment, bytes } => match self.driver.malloc(bytes)? {
                    Some(pointer) => {
                        self.segments.insert(segment, pointer);
                        self.observe(event)?;
                    }
                    None => return Ok(Some(bytes)),
                },
                SegmentChange::Released { segment } => {
                    if let Some(pointer) = self.segments.remove(&segment) {
                        self.driver.free(pointer)?;
                    }
                }
            }
        }
        self.peaks.allocated_bytes = self.peaks.allocated_bytes.max(self.allocator.allocated);
        self.peaks.reserved_bytes = self.peaks.reserved_bytes.max(self.allocator.reserved);
        Ok(None)
    }

    /// Where live allocation `id` starts: its segment's address plus its offset there.
    fn pointer(&self, id: AllocId) -> Option<u64> {
        let (segment, offset, _) = self.allocator.place(id as u64)?;
        Some(self.segments.get(&segment)? + offset)
    }

    /// Gives every held segment back.
    fn release_all(&mut self) {
        for (_, pointer) in self.segments.drain() {
            let _ = self.driver.free(pointer);
        }
    }
}

/// The GPUs `program` allocates on.
fn devices_used(program: &StepProgram) -> BTreeSet<u32> {
    program
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc(Alloc { device, .. }) => Some(*device),
            _ => None,
        })
        .collect()
}

/// Runs `program` (of `workload` for `model`) on the CUDA devices of this machine; see the
/// module documentation.
pub(crate) fn run(
    program: &StepProgram,
    model: &ModelDescription,
    workload: &Workload,
    hardware: &HardwareProfile,
    fold_devices: bool,
) -> Result<Validation, Unavailable> {
    driver_library()?;
    engine::libraries()?;
    result::init().map_err(driver_failed)?;
    let found = u32::try_from(CudaContext::device_count().map_err(driver_failed)?).unwrap_or(0);
    let needed = devices_used(program);
    if found == 0 || (!fold_devices && needed.iter().any(|d| *d >= found)) {
        return Err(Unavailable::TooFewDevices { needed: needed.into_iter().collect(), found });
    }
    let cuda_device = |index: u32| if fold_devices { index % found } else { index };
    let mut devices: BTreeMap<u32, Device> = BTreeMap::new();
    let mut contexts: BTreeMap<u32, Arc<CudaContext>> = BTreeMap::new();
    for &index in &needed {
        let context = CudaContext::new(cuda_device(index) as usize).map_err(driver_failed)?;
        let name = context.name().unwrap_or_else(|_| format!("CUDA device {}", cuda_device(index)));
        let device = Device::new(index, name, usable_bytes(hardware, index), Box::new(Cuda(context.clone())))
            .map_err(driver_failed)?;
        devices.insert(index, device);
        contexts.insert(index, context);
    }
    match engine::CudaEngine::new(&contexts) {
        Ok(cuda) => {
            let mut runner = Runner::new(model, workload, program, Box::new(cuda));
            execute(program, devices, Some(&mut runner)).map_err(driver_failed)
        }
        // The kernels did not compile, or cuBLAS did not start: nothing was taken yet.
        Err(message) => Ok(Validation {
            backend: crate::Backend::Cuda,
            outcome: Outcome::RuntimeError {
                error: "error".into(),
                module: String::new(),
                message,
                devices: Vec::new(),
            },
            devices: devices.into_values().map(|d| d.peaks).collect(),
            samples: Vec::new(),
            placed: Default::default(),
        }),
    }
}

/// The profile's usable bytes of GPU `index`: the model releases free segments before passing
/// them, as the simulator's replay of the same program does.
fn usable_bytes(hardware: &HardwareProfile, index: u32) -> u64 {
    hardware.devices.iter().find(|d| d.index == index).map_or(u64::MAX, |d| d.usable_bytes())
}

/// Replays `program` on `devices` (with its compute, where `runner` is given), gives everything
/// back, and reports.
fn execute(
    program: &StepProgram,
    mut devices: BTreeMap<u32, Device>,
    runner: Option<&mut Runner>,
) -> Result<Validation, DriverError> {
    let result = replay(program, &mut devices, runner);
    devices.values_mut().for_each(Device::release_all);
    let (outcome, samples) = result?;
    Ok(Validation {
        backend: crate::Backend::Cuda,
        outcome,
        devices: devices.into_values().map(|d| d.peaks).collect(),
        samples,
        placed: Default::default(),
    })
}

/// The program's operations, in order, until the end, an out-of-memory or the compute's stop.
fn replay(
    program: &StepProgram,
    devices: &mut BTreeMap<u32, Device>,
    mut runner: Option<&mut Runner>,
) -> Result<(Outcome, Vec<Sample>), DriverError> {
    let mut samples = Vec::new();
    let mut event = "load".to_string();
    let mut device_of: HashMap<usize, u32> = HashMap::new();
    for (at, op) in program.ops.iter().enumerate() {
        match *op {
            Op::Compute(c @ Compute { event: e, .. }) => {
                if let Some(runner) = runner.as_deref_mut() {
                    let pointers =
                        |d: u32, id: AllocId| devices.get(&d).and_then(|device| device.pointer(id));
                    if let Err(stop) = runner.compute(at, &c, &pointers) {
                        return Ok((stop.outcome(), samples));
                    }
                }
                event = program.describe(e);
                for (&index, device) in devices.iter_mut() {
                    let used = device.observe(&event)?;
                    samples.push(Sample {
                        event: event.clone(),
                        device: index,
                        allocated_bytes: device.allocator.allocated,
                        reserved_bytes: device.allocator.reserved,
                        driver_used_bytes: used,
                    });
                }
            }
            Op::Alloc(alloc @ Alloc { id, device: index, bytes, stream, .. }) => {
                if let Some(device) = devices.get_mut(&index) {
                    device_of.insert(id, index);
                    device.allocator.alloc_on(id as u64, bytes, stream);
                    if let Some(requested_bytes) = device.apply_segment_changes(&event)? {
                        let (free_bytes, _) = device.driver.memory()?;
                        let outcome =
                            Outcome::OutOfMemory { event, device: index, requested_bytes, free_bytes };
                        return Ok((outcome, samples));
                    }
                }
                if let Some(runner) = runner.as_deref_mut() {
                    let pointer = devices.get(&index).and_then(|device| device.pointer(id));
                    if let Err(stop) = runner.alloc(&alloc, pointer) {
                        return Ok((stop.outcome(), samples));
                    }
                }
            }
            Op::Free(id) => {
                if let Some(runner) = runner.as_deref_mut() {
                    let pointers =
                        |d: u32, id: AllocId| devices.get(&d).and_then(|device| device.pointer(id));
                    if let Err(stop) = runner.before_free(at, &pointers) {
                        return Ok((stop.outcome(), samples));
                    }
                    runner.free(id);
                }
                if let Some(device) = device_of.remove(&id).and_then(|index| devices.get_mut(&index)) {
                    device.allocator.free(id as u64);
                }
            }
        }
    }
    if let Some(runner) = runner {
        let pointers = |d: u32, id: AllocId| devices.get(&d).and_then(|device| device.pointer(id));
        if let Err(stop) = runner.finish(program.ops.len(), &pointers) {
            return Ok((stop.outcome(), samples));
        }
    }
    Ok((Outcome::Completed, samples))
}
