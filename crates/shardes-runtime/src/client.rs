//! PJRT clients, devices and host↔device transfers.

use std::sync::Arc;

use crate::api::{lossy, pjrt_args, pjrt_call};
use crate::buffer::Buffer;
use crate::cache::{BuildTarget, CompileCache};
use crate::dtype::Element;
use crate::error::{Result, RuntimeError};
use crate::ffi;
use crate::handle::ClientInner;
pub use crate::handle::DeviceInfo;
use crate::plugin::Plugin;

/// The most simulated CPU devices a client may ask for ([`ClientOptions::cpu_device_count`]).
///
/// The XLA CPU plugin runs a program's collectives on its intra-op thread pool, which it caps
/// at 256 threads (`kMaxIntraOpThreads` in XLA's `cpu_client.cc`), and a collective needs
/// every device's thread at once. Measured on the pinned plugin (2-core machine, the
/// quickstart ES program with n = 4 members per device): 256 devices run at 0.5 s per
/// generation; 384 and 512 devices each get exactly 256 threads into the all-gather, print
/// 20 s of "waiting for ... may be stuck" rendezvous errors and then abort the process
/// (SIGABRT after 40 s). Beyond that even creating the client stops being practical: 2,048
/// devices take 0.6 s, 16,384 take 43 s, and a million never finish. A trivial program
/// (one all-reduce) still ran on 2,048 devices, so the limit is about real programs, not
/// about device creation.
pub const MAX_CPU_DEVICES: usize = 256;

/// Options for [`Client::new`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Number of (simulated) CPU devices; passed as the plugin option `cpu_device_count`.
    /// `None` passes no option (the plugin's default, usually 1), which keeps non-CPU plugins
    /// that reject unknown options working. At most [`MAX_CPU_DEVICES`].
    pub cpu_device_count: Option<usize>,
}

/// Checks a requested simulated device count: at least 1, at most [`MAX_CPU_DEVICES`].
fn cpu_device_count(n: usize) -> Result<i64> {
    if n == 0 {
        return Err(RuntimeError::InvalidArgument(
            "cpu_device_count must be at least 1".into(),
        ));
    }
    if n > MAX_CPU_DEVICES {
        return Err(RuntimeError::TooManyDevices {
            requested: n,
            max: MAX_CPU_DEVICES,
        });
    }
    // Cannot fail below the maximum; kept as an error rather than a cast.
    i64::try_from(n)
        .map_err(|_| RuntimeError::InvalidArgument(format!("cpu_device_count {n} is too large")))
}

/// A PJRT client: a set of devices of one plugin. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
    /// Where [`Client::compile`] keeps and finds compiled programs ([`CompileCache`]).
    pub(crate) cache: Option<CompileCache>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl Client {
    /// Creates a client on `plugin`, with the compile cache the environment names
    /// ([`CompileCache::from_env`]; a bad `SHARDES_COMPILE_CACHE_MAX_BYTES` is an error).
    pub fn new(plugin: Arc<Plugin>, options: ClientOptions) -> Result<Client> {
        let cache = CompileCache::from_env()?;
        let name = "cpu_device_count";
        let count: i64;
        let mut opt = pjrt_args!(PJRT_NamedValue);
        let mut args = pjrt_args!(PJRT_Client_Create_Args);
        if let Some(n) = options.cpu_device_count {
            count = cpu_device_count(n)?;
            opt.name = name.as_ptr().cast();
            opt.name_size = name.len();
            opt.type_ = ffi::PJRT_NamedValue_kInt64;
            opt.__bindgen_anon_1.int64_value = count;
            opt.value_size = 1;
            args.create_options = &opt;
            args.num_options = 1;
        }
        // SAFETY: `opt` and `name` outlive the call; the plugin copies the options.
        unsafe { pjrt_call!(&*plugin, PJRT_Client_Create, &mut args)? };
        let raw = args.client;
        // Own the handle right away so that it is destroyed if a query below fails.
        let mut inner = ClientInner {
            plugin,
            raw,
            devices: Vec::new(),
            infos: Vec::new(),
            platform: String::new(),
        };
        inner.platform = query_platform(&inner)?;
        inner.devices = query_devices(&inner)?;
        inner.infos = inner
            .devices
            .iter()
            .map(|&d| describe(&inner, d))
            .collect::<Result<_>>()?;
        Ok(Client {
            inner: Arc::new(inner),
            cache,
        })
    }

    /// A CPU client with `devices` devices on the default plugin (discovery and provisioning as
    /// in [`crate::plugin::locate`]). `devices` is at most [`MAX_CPU_DEVICES`], checked before
    /// the plugin is looked for.
    pub fn cpu(devices: usize) -> Result<Client> {
        cpu_device_count(devices)?;
        Client::new(
            Plugin::load_default()?,
            ClientOptions {
                cpu_device_count: Some(devices),
            },
        )
    }

    /// This client with `cache` as its compile cache (`None`: every [`Client::compile`]
    /// compiles). A new client takes [`CompileCache::from_env`].
    pub fn with_compile_cache(mut self, cache: Option<CompileCache>) -> Client {
        self.cache = cache;
        self
    }

    /// The compile cache [`Client::compile`] uses, if any.
    pub fn compile_cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    /// What decides what this client's plugin builds, besides the program and its options
    /// (the compile cache's key); `None` when the plugin file cannot be identified.
    pub(crate) fn build_target(&self) -> Option<BuildTarget<'_>> {
        let plugin = self.plugin();
        let meta = std::fs::metadata(plugin.path()).ok()?;
        let mtime = meta
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        Some(BuildTarget {
            plugin_path: plugin.path(),
            plugin_len: meta.len(),
            plugin_mtime_ns: mtime.as_nanos(),
            api_version: plugin.api_version(),
            xla_version: plugin.xla_version().unwrap_or_default(),
            platform: self.platform_name(),
            device_count: self.device_count(),
            device_kinds: self.devices().into_iter().map(|d| d.kind).collect(),
        })
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// Addressable devices, in the order used for device indices everywhere in this crate.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.inner.infos.clone()
    }

    /// Number of addressable devices.
    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    /// Platform name (e.g. `cpu`).
    pub fn platform_name(&self) -> String {
        self.inner.platform.clone()
    }

    /// Copies `data` (dense, row-major, with shape `dims`) to device `device`.
    pub fn buffer_from_host<T: Element>(
        &self,
        data: &[T],
        dims: &[usize],
        device: usize,
    ) -> Result<Buffer> {
        check_host_len(data.len(), dims)?;
        let dev = *self
            .inner
            .devices
            .get(device)
            .ok_or(RuntimeError::NoSuchDevice {
                device,
                count: self.inner.devices.len(),
            })?;
        let dims_i64 = dims
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<std::result::Result<Vec<i64>, _>>()
            .map_err(|_| RuntimeError::InvalidArgument(format!("dims {dims:?} overflow i64")))?;
        let plugin = &*self.inner.plugin;
        let mut a = pjrt_args!(PJRT_Client_BufferFromHostBuffer_Args);
        a.client = self.inner.raw;
        a.data = data.as_ptr().cast();
        a.type_ = T::TYPE.to_pjrt();
        a.dims = dims_i64.as_ptr();
        a.num_dims = dims_i64.len();
        a.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        a.device = dev;
        // SAFETY: `data` is valid for `len * size_of::<T>()` bytes and every `Element` has
        // XLA's byte layout (bool is one byte holding 0 or 1, like pred); with
        // kImmutableOnlyDuringCall the plugin copies it before returning, and we also await
        // `done_with_host_buffer` before `data` can be released.
        unsafe { pjrt_call!(plugin, PJRT_Client_BufferFromHostBuffer, &mut a)? };
        let buffer = Buffer::new_known(
            Arc::clone(&self.inner),
            a.buffer,
            device,
            T::TYPE,
            dims.to_vec(),
        );
        plugin.api().await_event(a.done_with_host_buffer)?;
        Ok(buffer)
    }

    /// Splits `data` (shape `dims`) along dimension 0 into equal row blocks, one per device in
    /// device order. Errors if dim 0 is not a multiple of the device count.
    pub fn scatter_rows<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Vec<Buffer>> {
        let n = self.device_count();
        check_host_len(data.len(), dims)?;
        let rows = *dims.first().ok_or_else(|| {
            RuntimeError::InvalidArgument("scatter_rows needs an array of rank >= 1".into())
        })?;
        if n == 0 || rows % n != 0 {
            return Err(RuntimeError::UnevenSplit { rows, devices: n });
        }
        let mut block_dims = dims.to_vec();
        block_dims[0] = rows / n;
        let block: usize = block_dims.iter().product();
        (0..n)
            .map(|d| self.buffer_from_host(&data[d * block..(d + 1) * block], &block_dims, d))
            .collect()
    }

    /// Copies `data` (shape `dims`) to every device, in device order.
    pub fn replicate<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Vec<Buffer>> {
        (0..self.device_count())
            .map(|d| self.buffer_from_host(data, dims, d))
            .collect()
    }
}

/// Concatenates per-device row blocks (e.g. a row-sharded output, one buffer per device) back
/// into one host array, in the given order. All buffers must have the same type and the same
/// dims after dimension 0.
pub fn gather_rows<T: Element>(buffers: &[Buffer]) -> Result<Vec<T>> {
    let Some(first) = buffers.first() else {
        return Ok(Vec::new());
    };
    let tail = first.dims().get(1..).unwrap_or(&[]);
    let mut out = Vec::new();
    for (i, b) in buffers.iter().enumerate() {
        if b.dims().is_empty() || b.dims()[1..] != *tail {
            return Err(RuntimeError::ShapeMismatch {
                what: format!("gather_rows: buffer {i} (dims after the row dimension)"),
                expected: tail.to_vec(),
                got: b.dims().get(1..).unwrap_or(&[]).to_vec(),
            });
        }
        out.extend(b.to_host::<T>()?);
    }
    Ok(out)
}

/// Host data of `len` elements must fill `dims` exactly.
fn check_host_len(len: usize, dims: &[usize]) -> Result<()> {
    let expected: usize = dims.iter().product();
    if expected != len {
        return Err(RuntimeError::HostDataLength {
            dims: dims.to_vec(),
            expected,
            got: len,
        });
    }
    Ok(())
}

fn query_platform(inner: &ClientInner) -> Result<String> {
    let mut a = pjrt_args!(PJRT_Client_PlatformName_Args);
    a.client = inner.raw;
    // SAFETY: live client; the returned string lives as long as the client.
    unsafe {
        pjrt_call!(&*inner.plugin, PJRT_Client_PlatformName, &mut a)?;
        Ok(lossy(a.platform_name, a.platform_name_size))
    }
}

fn query_devices(inner: &ClientInner) -> Result<Vec<*mut ffi::PJRT_Device>> {
    let mut a = pjrt_args!(PJRT_Client_AddressableDevices_Args);
    a.client = inner.raw;
    // SAFETY: live client; the returned array lives as long as the client.
    unsafe {
        pjrt_call!(&*inner.plugin, PJRT_Client_AddressableDevices, &mut a)?;
        if a.addressable_devices.is_null() {
            return Ok(Vec::new());
        }
        Ok(std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices).to_vec())
    }
}

fn describe(inner: &ClientInner, dev: *mut ffi::PJRT_Device) -> Result<DeviceInfo> {
    let plugin = &*inner.plugin;
    let mut g = pjrt_args!(PJRT_Device_GetDescription_Args);
    g.device = dev;
    // SAFETY: `dev` belongs to the live client; descriptions and their strings live as long
    // as the client.
    unsafe {
        pjrt_call!(plugin, PJRT_Device_GetDescription, &mut g)?;
        let desc = g.device_description;
        let mut id = pjrt_args!(PJRT_DeviceDescription_Id_Args);
        id.device_description = desc;
        pjrt_call!(plugin, PJRT_DeviceDescription_Id, &mut id)?;
        let mut kind = pjrt_args!(PJRT_DeviceDescription_Kind_Args);
        kind.device_description = desc;
        pjrt_call!(plugin, PJRT_DeviceDescription_Kind, &mut kind)?;
        let mut dbg = pjrt_args!(PJRT_DeviceDescription_DebugString_Args);
        dbg.device_description = desc;
        pjrt_call!(plugin, PJRT_DeviceDescription_DebugString, &mut dbg)?;
        Ok(DeviceInfo {
            id: usize::try_from(id.id).unwrap_or(0),
            kind: lossy(kind.device_kind, kind.device_kind_size),
            description: lossy(dbg.debug_string, dbg.debug_string_size),
        })
    }
}
