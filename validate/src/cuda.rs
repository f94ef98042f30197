//! The `cuda` backend: a step program's allocations on real CUDA devices.
//!
//! Each plan GPU `i` is CUDA device `i`. Per device, the simulator's caching-allocator model
//! decides, allocation by allocation, which segments exist; every segment it creates is taken
//! from the driver with `cuMemAlloc` and every one it returns is given back with `cuMemFree`.
//! So the bytes the device holds are the bytes the prediction says PyTorch would reserve, and
//! the driver's count (`cuMemGetInfo`: total − free, as `nvidia-smi` shows it) is measured after
//! each new segment and at every event. A segment the driver refuses is the run's
//! out-of-memory: the event and device are noted, and everything taken is given back.
//!
//! The driver library is found before cudarc is asked for it (cudarc panics where it is
//! missing): [`driver_library`] tries the names cudarc would.

use crate::{DevicePeaks, Outcome, Sample, Unavailable, Validation};
use cudarc::driver::{CudaContext, DriverError, result, sys};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_sim::allocator::{CachingAllocator, SegmentChange};
use vramplan_sim::program::{Alloc, Compute, Op, StepProgram};

/// The name of the CUDA driver library that loads here, trying the names cudarc tries.
pub(crate) fn driver_library() -> Result<String, Unavailable> {
    let mut tried: Vec<String> = Vec::new();
    for library in ["cuda", "nvcuda"] {
        for name in cudarc::get_lib_name_candidates(library) {
            // SAFETY: loading the driver library runs its initialisers, exactly as cudarc's
            // own loading of it does; the handle is dropped at once.
            if unsafe { libloading::Library::new(&name) }.is_ok() {
                return Ok(name);
            }
            if !tried.contains(&name) {
                tried.push(name);
            }
        }
    }
    Err(Unavailable::NoDriver { tried })
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

/// Runs `program` on the CUDA devices of this machine; see the module documentation.
pub(crate) fn run(program: &StepProgram, hardware: &HardwareProfile) -> Result<Validation, Unavailable> {
    driver_library()?;
    result::init().map_err(driver_failed)?;
    let found = u32::try_from(CudaContext::device_count().map_err(driver_failed)?).unwrap_or(0);
    let needed = devices_used(program);
    if needed.iter().any(|d| *d >= found) {
        return Err(Unavailable::TooFewDevices { needed: needed.into_iter().collect(), found });
    }
    let mut devices: BTreeMap<u32, Device> = BTreeMap::new();
    for &index in &needed {
        let context = CudaContext::new(index as usize).map_err(driver_failed)?;
        let name = context.name().unwrap_or_else(|_| format!("CUDA device {index}"));
        let device = Device::new(index, name, usable_bytes(hardware, index), Box::new(Cuda(context)))
            .map_err(driver_failed)?;
        devices.insert(index, device);
    }
    execute(program, devices).map_err(driver_failed)
}

/// The profile's usable bytes of GPU `index`: the model releases free segments before passing
/// them, as the simulator's replay of the same program does.
fn usable_bytes(hardware: &HardwareProfile, index: u32) -> u64 {
    hardware.devices.iter().find(|d| d.index == index).map_or(u64::MAX, |d| d.usable_bytes())
}

/// Replays `program` on `devices`, gives everything back, and reports.
fn execute(program: &StepProgram, mut devices: BTreeMap<u32, Device>) -> Result<Validation, DriverError> {
    let result = replay(program, &mut devices);
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

/// The program's operations, in order, until the end or an out-of-memory.
fn replay(
    program: &StepProgram,
    devices: &mut BTreeMap<u32, Device>,
) -> Result<(Outcome, Vec<Sample>), DriverError> {
    let mut samples = Vec::new();
    let mut event = "load".to_string();
    let mut device_of: HashMap<usize, u32> = HashMap::new();
    for op in &program.ops {
        match *op {
            Op::Compute(Compute { event: e, .. }) => {
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
            Op::Alloc(Alloc { id, device: index, bytes, .. }) => {
                let Some(device) = devices.get_mut(&index) else { continue };
                device_of.insert(id, index);
                device.allocator.alloc(id as u64, bytes);
                if let Some(requested_bytes) = device.apply_segment_changes(&event)? {
                    let (free_bytes, _) = device.driver.memory()?;
                    let outcome = Outcome::OutOfMemory { event, device: index, requested_bytes, free_bytes };
                    return Ok((outcome, samples));
                }
            }
            Op::Free(id) => {
                if let Some(device) = device_of.remove(&id).and_then(|index| devices.get_mut(&index)) {
                    device.allocator.free(id as u64);
                }
            }
        }
    }
    Ok((Outcome::Completed, samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where no driver is installed (CI), the probe names the libraries it tried, without
    /// panicking; where one is, it names the one that loads.
    #[test]
    fn the_driver_probe_answers_either_way() {
        match driver_library() {
            Ok(name) => assert!(name.contains("cuda"), "{name}"),
            Err(Unavailable::NoDriver { tried }) => {
                assert!(tried.iter().any(|n| n == "libcuda.so" || n == "nvcuda.dll"), "{tried:?}")
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    /// A driver of `total` bytes that hands out addresses in order and counts what it holds.
    struct Fake {
        total: u64,
        held: std::rc::Rc<std::cell::RefCell<BTreeMap<u64, u64>>>,
        next: u64,
    }

    impl Driver for Fake {
        fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, DriverError> {
            let used: u64 = self.held.borrow().values().sum();
            if used + bytes > self.total {
                return Ok(None);
            }
            self.next += 1;
            self.held.borrow_mut().insert(self.next, bytes);
            Ok(Some(self.next))
        }

        fn free(&mut self, pointer: u64) -> Result<(), DriverError> {
            self.held
                .borrow_mut()
                .remove(&pointer)
                .map(|_| ())
                .ok_or(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))
        }

        fn memory(&mut self) -> Result<(u64, u64), DriverError> {
            let used: u64 = self.held.borrow().values().sum();
            Ok((self.total - used, self.total))
        }
    }

    /// GPT-2 trained two steps on a T4 at batch 2 × 256: the program and the simulator's
    /// estimate of it.
    fn gpt2_training() -> (StepProgram, vramplan_sim::Estimate) {
        use vramplan_profiles::model::{self, ImportOptions};
        use vramplan_sim::workload::{Mode, Workload};
        let model = model::load("gpt2", ImportOptions::default()).unwrap();
        let hardware = vramplan_profiles::hardware::load("t4").unwrap();
        let workload = Workload { mode: Mode::Train, batch: 2, seq: 256, ..Workload::default() };
        let placement = vramplan_sim::Placement::single(0);
        let program = vramplan_sim::program::step_program(&model, &hardware, &workload, &placement);
        let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement).unwrap();
        (program, estimate)
    }

    fn fake(total: u64) -> (Device, std::rc::Rc<std::cell::RefCell<BTreeMap<u64, u64>>>) {
        let held = std::rc::Rc::new(std::cell::RefCell::new(BTreeMap::new()));
        let driver = Fake { total, held: held.clone(), next: 0 };
        (Device::new(0, "fake".into(), total, Box::new(driver)).unwrap(), held)
    }

    /// On a device with room, the driver holds at the peak exactly the segments the allocator
    /// model reserves (the simulator's reserved figure for the same program), and nothing once
    /// the run is over.
    #[test]
    fn the_driver_holds_the_models_segments_and_gets_them_back() {
        let (program, predicted) = gpt2_training();
        let (device, held) = fake(64 << 30);
        let run = execute(&program, BTreeMap::from([(0, device)])).unwrap();
        assert_eq!(run.outcome, Outcome::Completed);
        let d = &run.devices[0];
        assert_eq!(d.reserved_bytes, predicted.devices[0].peak_reserved_bytes);
        assert_eq!(d.allocated_bytes, predicted.devices[0].peak_allocated_bytes);
        assert_eq!(d.driver_used_bytes, d.reserved_bytes, "the fake driver holds only the segments");
        assert!(held.borrow().is_empty(), "segments left: {:?}", held.borrow());
        assert!(run.samples.iter().any(|s| s.event.starts_with("optimizer step")));
    }

    /// On a device too small, the refused segment ends the run with its event and device, and
    /// every segment taken before it is given back.
    #[test]
    fn an_out_of_memory_is_reported_and_everything_given_back() {
        let (program, _) = gpt2_training();
        let (device, held) = fake(300 << 20);
        let run = execute(&program, BTreeMap::from([(0, device)])).unwrap();
        match &run.outcome {
            Outcome::OutOfMemory { device, requested_bytes, free_bytes, event } => {
                assert_eq!(*device, 0);
                assert!(requested_bytes > free_bytes, "{requested_bytes} asked with {free_bytes} free");
                assert!(!event.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(held.borrow().is_empty(), "segments left: {:?}", held.borrow());
    }
}
