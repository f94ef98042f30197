//! Running operations on CUDA devices: cuBLAS GEMMs, NVRTC kernels and copies between GPUs,
//! through cudarc, behind [`Engine`] so that the tests run the same path with a fake that
//! records the calls.
//!
//! cuBLAS and NVRTC are loaded at run time, as the driver is; cudarc panics where a library is
//! missing, so [`library`] looks for each first with the names cudarc tries, and a missing one
//! is [`Unavailable::NoLibrary`]. Every pointer an engine gets is inside an allocation of the
//! program (`bind.rs`); cuBLAS's workspace is the program's own `Workspace` allocation on each
//! GPU (`cublasSetWorkspace`), so the libraries take from the allocator nothing the program does
//! not hold. What they hold outside it (the cuBLAS handle, the loaded kernels) shows in the
//! driver's count only, as PyTorch's own handle and kernels do.

use super::ops::{Elem, GemmCall, Param};
use crate::Unavailable;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use vramplan_sim::program::AllocId;

/// The name of library `name` (`cuda`, `cublas`, `nvrtc`) that loads here, trying the names
/// cudarc tries, or the names tried.
pub(crate) fn find_library(names: &[&str]) -> Result<String, Vec<String>> {
    let mut tried: Vec<String> = Vec::new();
    for library in names {
        for name in cudarc::get_lib_name_candidates(library) {
            // SAFETY: loading the library runs its initialisers, exactly as cudarc's own
            // loading of it does; the handle is dropped at once.
            if unsafe { libloading::Library::new(&name) }.is_ok() {
                return Ok(name);
            }
            if !tried.contains(&name) {
                tried.push(name);
            }
        }
    }
    Err(tried)
}

/// cuBLAS and NVRTC, found or named as missing.
pub(crate) fn libraries() -> Result<(), Unavailable> {
    for library in ["cublas", "nvrtc"] {
        find_library(&[library])
            .map_err(|tried| Unavailable::NoLibrary { library: library.to_string(), tried })?;
    }
    Ok(())
}

/// A kernel argument after the pointers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arg {
    Pointer(u64),
    U64(u64),
    I32(i32),
    F32(f32),
}

impl From<Param> for Arg {
    fn from(p: Param) -> Arg {
        match p {
            Param::U64(v) => Arg::U64(v),
            Param::I32(v) => Arg::I32(v),
            Param::F32(v) => Arg::F32(v),
        }
    }
}

/// One call on a device.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    Gemm(GemmCall),
    Launch {
        kernel: &'static str,
        elem: Elem,
        grid: u32,
        block: u32,
        args: Vec<Arg>,
    },
    /// `bytes` from `from` on GPU `from_device` to `to` on the call's device.
    Copy {
        to: u64,
        from: u64,
        from_device: u32,
        bytes: u64,
    },
}

/// The memory a call reads and writes, per operand: in allocation `alloc` on `device`, `bytes`
/// from `offset`, at `pointer`. For the checks of a fake; a real engine needs only the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Touch {
    pub alloc: AllocId,
    pub device: u32,
    pub offset: u64,
    pub bytes: u64,
    pub pointer: u64,
}

/// What runs the operations: CUDA in a run, a recorder in the tests.
pub(crate) trait Engine {
    /// Gives cuBLAS on `device` its workspace.
    fn set_workspace(&mut self, device: u32, pointer: u64, bytes: u64) -> Result<(), String>;
    /// Queues `call` on `device` (`at`: the index of the program operation it runs before).
    fn run(&mut self, device: u32, at: usize, call: &Call, touched: &[Touch]) -> Result<(), String>;
    /// Waits for what `device` was given.
    fn synchronize(&mut self, device: u32) -> Result<(), String>;
}

/// One GPU's cuBLAS handle and kernels.
struct Gpu {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: cudarc::cublas::sys::cublasHandle_t,
    kernels: HashMap<(Elem, &'static str), CudaFunction>,
}

/// The CUDA devices of a run.
pub(crate) struct CudaEngine {
    gpus: BTreeMap<u32, Gpu>,
}

impl CudaEngine {
    /// Compiles the kernels for every element type with NVRTC, loads them and makes a cuBLAS
    /// handle on each of `contexts`.
    pub(crate) fn new(contexts: &BTreeMap<u32, Arc<CudaContext>>) -> Result<CudaEngine, String> {
        let mut ptx = Vec::new();
        for elem in Elem::ALL {
            let options = cudarc::nvrtc::CompileOptions {
                name: Some("vramplan_kernels.cu".into()),
                ..Default::default()
            };
            let compiled = cudarc::nvrtc::compile_ptx_with_opts(super::kernels::source(elem.code()), options)
                .map_err(|e| format!("NVRTC could not compile the kernels ({elem:?}): {e:?}"))?;
            ptx.push((elem, compiled));
        }
        // Each handle is in the engine as soon as it is made, so that a failure after it destroys it.
        let mut engine = CudaEngine { gpus: BTreeMap::new() };
        for (&index, context) in contexts {
            let failed = |e: &dyn std::fmt::Debug| format!("cuda:{index}: {e:?}");
            context.bind_to_thread().map_err(|e| failed(&e))?;
            let stream = context.default_stream();
            let blas = cudarc::cublas::result::create_handle().map_err(|e| failed(&e))?;
            let gpu = Gpu { context: context.clone(), stream, blas, kernels: HashMap::new() };
            let gpu = engine.gpus.entry(index).or_insert(gpu);
            // SAFETY: a handle just made, and the context's default stream.
            unsafe { cudarc::cublas::result::set_stream(gpu.blas, gpu.stream.cu_stream() as _) }
                .map_err(|e| failed(&e))?;
            for (elem, compiled) in &ptx {
                let module = context.load_module(compiled.clone()).map_err(|e| failed(&e))?;
                for s in super::kernels::SIGNATURES {
                    let function = module.load_function(s.name).map_err(|e| failed(&e))?;
                    gpu.kernels.insert((*elem, s.name), function);
                }
            }
        }
        Ok(engine)
    }

    fn gpu(&mut self, device: u32) -> Result<&mut Gpu, String> {
        let gpu =
            self.gpus.get_mut(&device).ok_or_else(|| format!("cuda:{device} is not part of the run"))?;
        gpu.context.bind_to_thread().map_err(|e| format!("cuda:{device}: {e:?}"))?;
        Ok(gpu)
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        for gpu in self.gpus.values() {
            if gpu.context.bind_to_thread().is_ok() {
                // SAFETY: the handle was made in `new` and is destroyed once.
                let _ = unsafe { cudarc::cublas::result::destroy_handle(gpu.blas) };
            }
        }
    }
}

fn data_type(elem: Elem) -> cudarc::cublas::sys::cudaDataType {
    use cudarc::cublas::sys::cudaDataType;
    match elem {
        Elem::F32 => cudaDataType::CUDA_R_32F,
        Elem::F16 => cudaDataType::CUDA_R_16F,
        Elem::Bf16 => cudaDataType::CUDA_R_16BF,
    }
}

impl Engine for CudaEngine {
    fn set_workspace(&mut self, device: u32, pointer: u64, bytes: u64) -> Result<(), String> {
        let gpu = self.gpu(device)?;
        // SAFETY: the workspace is the program's allocation on this device, made at the load and
        // never freed before the run ends; cuBLAS uses it only inside the calls of this run.
        unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(gpu.blas, pointer as *mut _, bytes as usize) }
            .result()
            .map_err(|e| format!("cublasSetWorkspace on cuda:{device}: {e:?}"))
    }

    fn run(&mut self, device: u32, _at: usize, call: &Call, _touched: &[Touch]) -> Result<(), String> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
        if let Call::Copy { to, from, from_device, bytes } = call {
            let source = self.gpu(*from_device)?.context.cu_ctx();
            let target = self.gpu(device)?.context.cu_ctx();
            // SAFETY: both ranges lie in live allocations of their devices.
            return unsafe { cudarc::driver::sys::cuMemcpyPeer(*to, target, *from, source, *bytes as usize) }
                .result()
                .map_err(|e| format!("copy from cuda:{from_device} to cuda:{device}: {e:?}"));
        }
        let gpu = self.gpu(device)?;
        match call {
            Call::Gemm(g) => {
                let op =
                    |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
                let (alpha, beta) = (1.0f32, 0.0f32);
                let t = data_type(g.elem);
                // SAFETY: the pointers are in live allocations of this device, each holding the
                // `ld × columns` elements the call reads or writes (`bind.rs`, `ops::gemm_call`).
                unsafe {
                    cudarc::cublas::result::gemm_strided_batched_ex(
                        gpu.blas,
                        op(g.transa),
                        op(g.transb),
                        g.m,
                        g.n,
                        g.k,
                        (&alpha as *const f32).cast(),
                        g.a as *const _,
                        t,
                        g.lda,
                        g.stride_a,
                        g.b as *const _,
                        t,
                        g.ldb,
                        g.stride_b,
                        (&beta as *const f32).cast(),
                        g.c as *mut _,
                        t,
                        g.ldc,
                        g.stride_c,
                        g.batch,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| format!("cuBLAS GEMM on cuda:{device}: {e:?}"))
            }
            Call::Launch { kernel, elem, grid, block, args } => {
                let function =
                    gpu.kernels.get(&(*elem, *kernel)).ok_or_else(|| format!("no kernel {kernel}"))?;
                let mut launch = gpu.stream.launch_builder(function);
                // Each argument by reference into `args`, which outlives the launch.
                for a in args {
                    match a {
                        Arg::Pointer(v) | Arg::U64(v) => launch.arg(v),
                        Arg::I32(v) => launch.arg(v),
                        Arg::F32(v) => launch.arg(v),
                    };
                }
                let config =
                    LaunchConfig { grid_dim: (*grid, 1, 1), block_dim: (*block, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the arguments follow the kernel's signature (`kernels::SIGNATURES`,
                // checked against the source), and every pointer is in a live allocation of this
                // device holding what the kernel reads or writes at these dims.
                unsafe { launch.launch(config) }
                    .map(|_| ())
                    .map_err(|e| format!("{kernel} on cuda:{device}: {e:?}"))
            }
            Call::Copy { .. } => unreachable!("copies are made above"),
        }
    }

    fn synchronize(&mut self, device: u32) -> Result<(), String> {
        self.gpu(device)?.stream.synchronize().map_err(|e| format!("cuda:{device}: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a library is missing (as on a machine without CUDA), the probe names it and the
    /// names cudarc would try, without panicking.
    #[test]
    fn a_missing_library_is_named_with_the_names_tried() {
        match libraries() {
            Ok(()) => {}
            Err(Unavailable::NoLibrary { library, tried }) => {
                assert!(library == "cublas" || library == "nvrtc", "{library}");
                let expected =
                    format!("{}{library}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
                assert!(tried.contains(&expected), "{tried:?}");
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
        assert!(find_library(&["surely-not-a-cuda-library"]).is_err());
    }
}
