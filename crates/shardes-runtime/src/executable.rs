//! Compiling StableHLO programs and running them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use prost::Message;

use crate::api::{lossy, pjrt_args, pjrt_call};
use crate::buffer::Buffer;
use crate::cache::CompileCache;
use crate::client::Client;
use crate::dtype::ElementType;
use crate::error::{Result, RuntimeError};
use crate::ffi;
use crate::handle::ClientInner;
use crate::hlo::HloModule;
use crate::proto;

/// Options for [`Client::compile`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Number of SPMD partitions (devices) the program runs on; must match the module's
    /// `mhlo.num_partitions` and be at most the client's device count. Partition `i` runs on
    /// device `i` (identity assignment).
    pub num_partitions: usize,
    /// Run XLA's SPMD partitioner (needed for sharded programs). Default `true`.
    pub use_spmd_partitioning: bool,
    /// Use Shardy (`sdy` dialect annotations) rather than GSPMD. Default `true`.
    pub use_shardy_partitioner: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_partitions: 1,
            use_spmd_partitioning: true,
            use_shardy_partitioner: true,
        }
    }
}

impl CompileOptions {
    /// Defaults with `num_partitions` partitions.
    pub fn new(num_partitions: usize) -> Self {
        CompileOptions {
            num_partitions,
            ..Default::default()
        }
    }

    /// The serialized `xla.CompileOptionsProto` handed to the plugin.
    pub fn to_proto_bytes(&self) -> Vec<u8> {
        let parts = self.num_partitions as i64;
        proto::CompileOptionsProto {
            executable_build_options: Some(proto::ExecutableBuildOptionsProto {
                device_ordinal: -1,
                num_replicas: 1,
                num_partitions: parts,
                use_spmd_partitioning: self.use_spmd_partitioning,
                device_assignment: Some(proto::DeviceAssignmentProto {
                    replica_count: 1,
                    computation_count: self.num_partitions as i32,
                    computation_devices: (0..parts)
                        .map(|d| proto::ComputationDevice {
                            replica_device_ids: vec![d],
                        })
                        .collect(),
                }),
                use_shardy_partitioner: self.use_shardy_partitioner,
            }),
        }
        .encode_to_vec()
    }
}

/// Options for [`Executable::execute_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecuteOptions {
    /// Input indices that must not be donated even if the program aliases them to an output
    /// (`tf.aliasing_output`); such inputs stay usable after the call.
    pub non_donatable_inputs: Vec<usize>,
}

/// Compile-time memory statistics reported by the plugin (bytes, per device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompiledMemoryStats {
    /// Size of the generated code.
    pub generated_code_size_in_bytes: i64,
    /// Size of all arguments.
    pub argument_size_in_bytes: i64,
    /// Size of all outputs.
    pub output_size_in_bytes: i64,
    /// Bytes of arguments reused for outputs.
    pub alias_size_in_bytes: i64,
    /// Scratch memory.
    pub temp_size_in_bytes: i64,
    /// Peak memory, if the plugin computes it (0 otherwise).
    pub peak_memory_in_bytes: i64,
}

/// Expected type and per-device dims of one argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSpec {
    /// Element type.
    pub element_type: ElementType,
    /// Per-device dims (after partitioning).
    pub dims: Vec<usize>,
}

/// A compiled, loaded program. Owns its C handles; keeps the client alive.
pub struct Executable {
    client: Arc<ClientInner>,
    loaded: *mut ffi::PJRT_LoadedExecutable,
    exe: *mut ffi::PJRT_Executable,
    /// Client device index for each partition, in execution order.
    device_indices: Vec<usize>,
    num_outputs: usize,
    params: Option<Vec<ArgSpec>>,
    outputs: Option<Vec<ArgSpec>>,
}

// SAFETY: loaded executables may be executed concurrently from any thread (C API contract);
// we own both handles exclusively and free them once, in Drop.
unsafe impl Send for Executable {}
// SAFETY: as above.
unsafe impl Sync for Executable {}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("devices", &self.device_indices)
            .field("num_outputs", &self.num_outputs)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let plugin = &*self.client.plugin;
        // SAFETY: we own both handles and destroy each exactly once; errors cannot be
        // reported from Drop.
        unsafe {
            if !self.exe.is_null() {
                let mut a = pjrt_args!(PJRT_Executable_Destroy_Args);
                a.executable = self.exe;
                let _ = pjrt_call!(plugin, PJRT_Executable_Destroy, &mut a);
            }
            let mut a = pjrt_args!(PJRT_LoadedExecutable_Destroy_Args);
            a.executable = self.loaded;
            let _ = pjrt_call!(plugin, PJRT_LoadedExecutable_Destroy, &mut a);
        }
    }
}

impl Client {
    /// Compiles StableHLO MLIR text, or loads it from the client's compile cache
    /// ([`Client::compile_cache`]) when the same program was compiled before with the same
    /// options, plugin and devices (a compiled program is saved there). On failure the
    /// [`RuntimeError::Pjrt`] message carries XLA's diagnostic.
    pub fn compile(&self, mlir: &str, options: &CompileOptions) -> Result<Executable> {
        let Some(cache) = &self.cache else {
            return self.compile_uncached(mlir, options);
        };
        let Some(key) = self.cache_key(mlir, options) else {
            return self.compile_uncached(mlir, options);
        };
        let _turn = CompileCache::claim(&key);
        if let Some(exe) = cache.load(&key, |bytes| self.deserialize(bytes).ok()) {
            return Ok(exe);
        }
        let exe = self.compile_uncached(mlir, options)?;
        // A cache that cannot be written costs the next run a compile, nothing else.
        if let Ok(bytes) = exe.serialize() {
            let _ = cache.store(&key, &bytes);
        }
        Ok(exe)
    }

    /// The compile cache's key for `mlir` compiled with `options` on this client, or `None`
    /// when the plugin file cannot be identified (then nothing is cached).
    fn cache_key(&self, mlir: &str, options: &CompileOptions) -> Option<String> {
        let target = self.build_target()?;
        Some(CompileCache::key(&target, mlir, &options.to_proto_bytes()))
    }

    /// Compiles StableHLO MLIR text with the plugin, never through the compile cache (what a
    /// measurement of compile time needs).
    pub fn compile_uncached(&self, mlir: &str, options: &CompileOptions) -> Result<Executable> {
        let devices = self.device_count();
        if options.num_partitions == 0 || options.num_partitions > devices {
            return Err(RuntimeError::InvalidArgument(format!(
                "compile: num_partitions = {} but the client has {devices} device(s); fix: \
                 create the client with at least that many devices \
                 (ClientOptions::cpu_device_count)",
                options.num_partitions
            )));
        }
        let inner = &self.inner;
        let plugin = &*inner.plugin;
        let opts = options.to_proto_bytes();
        let format = "mlir";
        let mut program = pjrt_args!(PJRT_Program);
        // The C field is `char*` because other functions write into it; Compile only reads.
        program.code = mlir.as_ptr() as *mut std::os::raw::c_char;
        program.code_size = mlir.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut a = pjrt_args!(PJRT_Client_Compile_Args);
        a.client = inner.raw;
        a.program = &program;
        a.compile_options = opts.as_ptr().cast();
        a.compile_options_size = opts.len();
        // SAFETY: all pointers reference locals that outlive the call.
        unsafe { pjrt_call!(plugin, PJRT_Client_Compile, &mut a)? };
        Executable::own(inner, a.executable)
    }

    /// Loads an executable that [`Executable::serialize`] wrote, with this client's plugin
    /// and devices (the same plugin build and device count it was compiled for; the plugin
    /// refuses or misreads anything else, so [`CompileCache`] keys on both).
    pub fn deserialize(&self, bytes: &[u8]) -> Result<Executable> {
        let inner = &self.inner;
        let mut a = pjrt_args!(PJRT_Executable_DeserializeAndLoad_Args);
        a.client = inner.raw;
        a.serialized_executable = bytes.as_ptr().cast();
        a.serialized_executable_size = bytes.len();
        // SAFETY: `bytes` outlives the call; the plugin copies what it keeps.
        unsafe { pjrt_call!(&*inner.plugin, PJRT_Executable_DeserializeAndLoad, &mut a)? };
        Executable::own(inner, a.loaded_executable)
    }
}

impl CompileCache {
    /// The file that holds (or would hold) `mlir` compiled with `options` on `client`;
    /// `None` when the plugin file cannot be identified, and then nothing is cached.
    pub fn entry_path(
        &self,
        client: &Client,
        mlir: &str,
        options: &CompileOptions,
    ) -> Option<PathBuf> {
        Some(self.path(&client.cache_key(mlir, options)?))
    }
}

impl Executable {
    /// The compiled program as bytes that [`Client::deserialize`] loads again without
    /// compiling (the plugin's own format).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let plugin = &*self.client.plugin;
        let mut a = pjrt_args!(PJRT_Executable_Serialize_Args);
        a.executable = self.exe;
        // SAFETY: live handle; the plugin hands back bytes it owns until the deleter runs.
        unsafe { pjrt_call!(plugin, PJRT_Executable_Serialize, &mut a)? };
        // SAFETY: `serialized_bytes` points at `serialized_bytes_size` bytes that stay valid
        // until `serialized_executable_deleter` is called, which happens right after the copy.
        let bytes = unsafe {
            let out = if a.serialized_bytes.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(a.serialized_bytes.cast::<u8>(), a.serialized_bytes_size)
                    .to_vec()
            };
            if let Some(delete) = a.serialized_executable_deleter {
                delete(a.serialized_executable);
            }
            out
        };
        if bytes.is_empty() {
            return Err(RuntimeError::Decode {
                what: "serialized executable",
                reason: "the plugin returned no bytes".into(),
            });
        }
        Ok(bytes)
    }

    /// Takes ownership of a loaded executable the plugin just created for `client`.
    fn own(client: &Arc<ClientInner>, loaded: *mut ffi::PJRT_LoadedExecutable) -> Result<Self> {
        let mut exe = Executable {
            client: Arc::clone(client),
            loaded,
            exe: std::ptr::null_mut(),
            device_indices: Vec::new(),
            num_outputs: 0,
            params: None,
            outputs: None,
        };
        exe.init()?;
        Ok(exe)
    }

    fn init(&mut self) -> Result<()> {
        let plugin = &*self.client.plugin;
        let mut g = pjrt_args!(PJRT_LoadedExecutable_GetExecutable_Args);
        g.loaded_executable = self.loaded;
        // SAFETY: live loaded executable; the returned handle is owned by `self` from here on.
        unsafe { pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut g)? };
        self.exe = g.executable;

        let mut d = pjrt_args!(PJRT_LoadedExecutable_AddressableDevices_Args);
        d.executable = self.loaded;
        // SAFETY: live handle; the array lives as long as the executable.
        let devs = unsafe {
            pjrt_call!(plugin, PJRT_LoadedExecutable_AddressableDevices, &mut d)?;
            if d.addressable_devices.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(d.addressable_devices, d.num_addressable_devices)
                    .to_vec()
            }
        };
        self.device_indices = devs
            .iter()
            .map(|&p| {
                self.client.device_index(p).ok_or_else(|| {
                    RuntimeError::InvalidArgument(
                        "executable runs on a device the client does not list".into(),
                    )
                })
            })
            .collect::<Result<_>>()?;

        let mut n = pjrt_args!(PJRT_Executable_NumOutputs_Args);
        n.executable = self.exe;
        // SAFETY: live handle.
        unsafe { pjrt_call!(plugin, PJRT_Executable_NumOutputs, &mut n)? };
        self.num_outputs = n.num_outputs;
        // Both are optional conveniences: plugins that lack them still run programs, and
        // execution then lets PJRT's own checks report mismatches.
        self.outputs = self.query_outputs().ok();
        self.params = self.optimized_hlo().ok().and_then(|m| {
            m.entry_parameters()
                .into_iter()
                .map(|s| {
                    Some(ArgSpec {
                        element_type: s.array_type()?,
                        dims: s.dims,
                    })
                })
                .collect()
        });
        Ok(())
    }

    fn query_outputs(&self) -> Result<Vec<ArgSpec>> {
        let plugin = &*self.client.plugin;
        let mut t = pjrt_args!(PJRT_Executable_OutputElementTypes_Args);
        t.executable = self.exe;
        let mut d = pjrt_args!(PJRT_Executable_OutputDimensions_Args);
        d.executable = self.exe;
        // SAFETY: live handle; the returned arrays live as long as the executable and have
        // the stated lengths.
        unsafe {
            pjrt_call!(plugin, PJRT_Executable_OutputElementTypes, &mut t)?;
            pjrt_call!(plugin, PJRT_Executable_OutputDimensions, &mut d)?;
            let n = t.num_output_types;
            if n != d.num_outputs || (n > 0 && (t.output_types.is_null() || d.dim_sizes.is_null()))
            {
                return Err(RuntimeError::InvalidArgument(
                    "inconsistent output metadata".into(),
                ));
            }
            let types = if n == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(t.output_types, n)
            };
            let sizes = if n == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(d.dim_sizes, n)
            };
            let total: usize = sizes.iter().sum();
            let dims = if total == 0 || d.dims.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(d.dims, total)
            };
            let mut out = Vec::with_capacity(n);
            let mut off = 0;
            for i in 0..n {
                out.push(ArgSpec {
                    element_type: ElementType::from_pjrt(types[i])
                        .map_err(RuntimeError::UnsupportedElementType)?,
                    dims: dims[off..off + sizes[i]]
                        .iter()
                        .map(|&x| x.max(0) as usize)
                        .collect(),
                });
                off += sizes[i];
            }
            Ok(out)
        }
    }

    /// Number of partitions (= argument lists per call = devices it runs on).
    pub fn num_partitions(&self) -> usize {
        self.device_indices.len()
    }

    /// Client device index of each partition.
    pub fn devices(&self) -> &[usize] {
        &self.device_indices
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Per-device output types and dims, if the plugin reports them.
    pub fn output_specs(&self) -> Option<&[ArgSpec]> {
        self.outputs.as_deref()
    }

    /// Per-device parameter types and dims (from the optimized HLO), if available. Used to
    /// validate arguments before calling into the plugin.
    pub fn parameter_specs(&self) -> Option<&[ArgSpec]> {
        self.params.as_deref()
    }

    /// Runs the program. `args[d]` is the argument list for partition `d` (each buffer on that
    /// partition's device). Returns the outputs per partition.
    pub fn execute(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        self.execute_with(args, &ExecuteOptions::default())
    }

    /// [`Executable::execute`] with options.
    pub fn execute_with(
        &self,
        args: &[Vec<&Buffer>],
        options: &ExecuteOptions,
    ) -> Result<Vec<Vec<Buffer>>> {
        self.validate(args)?;
        let plugin = &*self.client.plugin;
        let n = self.device_indices.len();
        let num_args = args.first().map_or(0, Vec::len);
        let raw_args: Vec<Vec<*mut ffi::PJRT_Buffer>> = args
            .iter()
            .map(|list| list.iter().map(|b| b.raw).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_args.iter().map(|l| l.as_ptr()).collect();
        let mut out_raw: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); self.num_outputs]; n];
        let out_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> =
            out_raw.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); n];
        let non_donatable: Vec<i64> = options
            .non_donatable_inputs
            .iter()
            .map(|&i| i as i64)
            .collect();
        let mut opts = pjrt_args!(PJRT_ExecuteOptions);
        opts.launch_id = next_launch_id();
        opts.non_donatable_input_indices = non_donatable.as_ptr();
        opts.num_non_donatable_input_indices = non_donatable.len();
        let mut a = pjrt_args!(PJRT_LoadedExecutable_Execute_Args);
        a.executable = self.loaded;
        a.options = &mut opts;
        a.argument_lists = arg_ptrs.as_ptr();
        a.num_devices = n;
        a.num_args = num_args;
        a.output_lists = out_ptrs.as_ptr();
        a.device_complete_events = events.as_mut_ptr();
        // SAFETY: argument and output arrays have the [n][num_args] / [n][num_outputs] shapes
        // the C API requires and outlive the call; argument buffers are live (validated, and
        // borrowed for the duration of this function).
        unsafe { pjrt_call!(plugin, PJRT_LoadedExecutable_Execute, &mut a)? };
        drop(out_ptrs);
        // Take ownership of every output before waiting, so nothing leaks on error.
        let mut outputs = Vec::with_capacity(n);
        let mut first_err = None;
        for (d, list) in out_raw.into_iter().enumerate() {
            let mut bufs = Vec::with_capacity(list.len());
            for raw in list {
                if raw.is_null() {
                    continue;
                }
                match Buffer::from_raw(Arc::clone(&self.client), raw, self.device_indices[d]) {
                    Ok(b) => bufs.push(b),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            outputs.push(bufs);
        }
        for ev in events {
            if let Err(e) = plugin.api().await_event(ev) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(outputs),
        }
    }

    fn validate(&self, args: &[Vec<&Buffer>]) -> Result<()> {
        let n = self.device_indices.len();
        let client_devices = self.client.devices.len();
        if args.len() > client_devices {
            return Err(RuntimeError::Arity(format!(
                "got {} argument lists but the client has only {client_devices} device(s) (the \
                 executable runs on {n}); pass one argument list per partition",
                args.len()
            )));
        }
        if args.len() != n {
            return Err(RuntimeError::Arity(format!(
                "got {} argument lists but the executable was compiled for {n} partition(s); \
                 pass one argument list per partition",
                args.len()
            )));
        }
        let expected_arity = match &self.params {
            Some(p) => p.len(),
            None => args.first().map_or(0, Vec::len),
        };
        for (d, list) in args.iter().enumerate() {
            if list.len() != expected_arity {
                return Err(RuntimeError::Arity(format!(
                    "argument list {d} has {} argument(s), the program takes {expected_arity}",
                    list.len()
                )));
            }
            for (i, b) in list.iter().enumerate() {
                let what = || format!("argument {i} of partition {d}");
                if !Arc::ptr_eq(&b.client, &self.client) {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "{} belongs to a different client than the executable",
                        what()
                    )));
                }
                if b.device() != self.device_indices[d] {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "{} is on device {} but partition {d} runs on device {}",
                        what(),
                        b.device(),
                        self.device_indices[d]
                    )));
                }
                if b.is_deleted()? {
                    return Err(RuntimeError::BufferDeleted { what: what() });
                }
                if let Some(spec) = self.params.as_ref().and_then(|p| p.get(i)) {
                    if b.element_type() != spec.element_type {
                        return Err(RuntimeError::DtypeMismatch {
                            what: what(),
                            expected: spec.element_type,
                            got: b.element_type(),
                        });
                    }
                    if b.dims() != spec.dims.as_slice() {
                        return Err(RuntimeError::ShapeMismatch {
                            what: what(),
                            expected: spec.dims.clone(),
                            got: b.dims().to_vec(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The optimized (partitioned, per-device) HLO module XLA built.
    pub fn optimized_hlo(&self) -> Result<HloModule> {
        let plugin = &*self.client.plugin;
        let mut program = pjrt_args!(PJRT_Program);
        let mut a = pjrt_args!(PJRT_Executable_OptimizedProgram_Args);
        a.executable = self.exe;
        a.program = &mut program;
        // SAFETY: first call with `code == null` only sets `code_size` (and `format`, which
        // the plugin owns).
        unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut a)? };
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        a.program = &mut program;
        // SAFETY: `code` is a client-owned buffer of `code_size` bytes, as the API requires.
        unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut a)? };
        code.truncate(program.code_size);
        // SAFETY: the plugin set `format`/`format_size` to a string it owns, valid while the
        // executable lives.
        let format = unsafe { lossy(program.format, program.format_size) };
        match format.as_str() {
            "hlo_with_config" => HloModule::decode(&code, true),
            "hlo" => HloModule::decode(&code, false),
            other => Err(RuntimeError::Decode {
                what: "optimized program",
                reason: format!("unexpected format {other:?}"),
            }),
        }
    }

    /// Compile-time memory statistics, if the plugin offers them.
    pub fn compiled_memory_stats(&self) -> Result<CompiledMemoryStats> {
        let mut a = pjrt_args!(PJRT_Executable_GetCompiledMemoryStats_Args);
        a.executable = self.exe;
        // SAFETY: live handle; only output integers are written.
        unsafe {
            pjrt_call!(
                &*self.client.plugin,
                PJRT_Executable_GetCompiledMemoryStats,
                &mut a
            )?
        };
        Ok(CompiledMemoryStats {
            generated_code_size_in_bytes: a.generated_code_size_in_bytes,
            argument_size_in_bytes: a.argument_size_in_bytes,
            output_size_in_bytes: a.output_size_in_bytes,
            alias_size_in_bytes: a.alias_size_in_bytes,
            temp_size_in_bytes: a.temp_size_in_bytes,
            peak_memory_in_bytes: a.peak_memory_in_bytes,
        })
    }
}

/// The launch id of the next execution, unique among the executions of this process that
/// can overlap.
///
/// XLA:CPU keys the rendezvous of a program's collectives on the launch id (its `run_id`)
/// and the devices, process-wide: two clients in one process running collective programs
/// at the same time with the default id 0 join each other's all-reduce and abort
/// (`Check failed: id < num_threads`, seen with two tests' clients on two threads). Ids
/// wrap within the positive `i32` range; only executions in flight together must differ.
fn next_launch_id() -> i32 {
    static NEXT: AtomicI32 = AtomicI32::new(1);
    (NEXT.fetch_add(1, Ordering::Relaxed) & i32::MAX).max(1)
}
