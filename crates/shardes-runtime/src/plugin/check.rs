//! Checks made on a plugin file before it is `dlopen`ed.
//!
//! `dlopen` maps the file and runs its initialisers; a file shorter than its headers say
//! (a partial copy, a full disk) is then read past its end and the process dies of SIGBUS,
//! with no error to report. So every file is checked first:
//!
//! - a **pinned** plugin in the cache (a file named as [`PinnedPlugin::cached_path`] names
//!   it) must have the pinned size and sha256 ([`verify_pinned`]);
//! - **any other** file must be a regular file holding a 64-bit ELF shared object for this
//!   machine, at least [`MIN_PLUGIN_BYTES`] long, whose segments, sections and header tables
//!   all lie inside the file, and whose dynamic symbol table defines `GetPjrtApi`
//!   ([`check_elf`]). The headers are read with bounds-checked positional reads; nothing
//!   else of the file is read.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

use super::provision::{hex, PinnedPlugin, NAMED};
use crate::error::{Result, RuntimeError};

/// The smallest file accepted as a plugin. Real PJRT plugins are hundreds of MB (the CPU
/// plugin 259 MB); anything under 64 KiB is a stub, a linker script or a fragment.
pub const MIN_PLUGIN_BYTES: u64 = 64 * 1024;

/// Refuses `path` unless it is a plausible plugin file (see the module documentation).
/// `path` is canonical (symlinks resolved), so the pinned-cache test sees the real location.
pub(crate) fn check_plugin_file(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| RuntimeError::io(path, e))?;
    if meta.is_dir() {
        return Err(RuntimeError::PluginIsDirectory {
            path: path.to_path_buf(),
        });
    }
    if !meta.is_file() {
        return Err(not_a_plugin(
            path,
            "it is not a regular file (a device, socket or pipe)",
        ));
    }
    match pinned_for(path) {
        Some(pin) => verify_pinned(pin, path),
        None => check_elf(path),
    }
}

fn not_a_plugin(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::NotAPlugin {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The pinned plugin whose cache entry `path` is: a file named like the pin's library in a
/// directory named `<package>-<version>-<first 12 hex of its sha256>` (see
/// [`PinnedPlugin::cached_path`]). Recognised by name, so a cache under any root counts.
fn pinned_for(path: &Path) -> Option<&'static PinnedPlugin> {
    let file = path.file_name()?.to_str()?;
    let dir = path.parent()?.file_name()?.to_str()?;
    NAMED
        .iter()
        .find(|p| p.so_file_name() == file && dir == p.cache_dir_name())
}

// ---------------------------------------------------------------------------------------
// Pinned plugins: size always, sha256 once per file identity.
// ---------------------------------------------------------------------------------------

/// Checks a cached pinned plugin against its pin.
///
/// Hashing the 259 MB CPU plugin with this function takes 0.18 s when the file is in the page
/// cache (measured on this project's 2-core machine, whose CPU has SHA extensions;
/// `sha256sum` takes 0.86 s there), and as long as reading all 259 MB from disk when it is
/// not, which `dlopen` itself never does (it maps the file and touches only what runs). That
/// would be paid on every start of the CLI, so the size is compared on every load (it catches
/// truncation, the failure that crashes `dlopen`), and the sha256 only once per *file
/// identity*: after a successful hash a small stamp file next to the plugin
/// (`.<library>.verified`) records size, modification time, device, inode and hash. A later
/// process whose file still has that size, mtime and inode trusts the stamp; any rewrite,
/// copy or truncation changes one of them and the file is hashed again. Within one process a
/// file is hashed at most once (verified identities are remembered, and
/// [`super::Plugin::load`] keeps every loaded plugin).
///
/// The stamp guards against accidents, not tampering: whoever can rewrite the stamp can
/// rewrite the plugin. If it cannot be written (a read-only cache) every process hashes.
pub fn verify_pinned(pin: &PinnedPlugin, path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| RuntimeError::io(path, e))?;
    let damaged = |problem: String| RuntimeError::PluginDamaged {
        path: path.to_path_buf(),
        problem,
        package: pin.package,
        version: pin.version,
    };
    if let Some(expected) = pin.so_size {
        let size = meta.len();
        if size < expected {
            return Err(damaged(format!(
                "it is truncated ({size} bytes, expected {expected})"
            )));
        }
        if size > expected {
            return Err(damaged(format!("it has {size} bytes, expected {expected}")));
        }
    }
    let id = Identity::of(path, &meta);
    if verified()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&id)
    {
        return Ok(());
    }
    let stamp = stamp_path(path);
    if read_stamp(&stamp).is_some_and(|s| s == id.stamp_text(pin.so_sha256)) {
        remember(id);
        return Ok(());
    }
    let digest = sha256_file(path)?;
    if digest != pin.so_sha256 {
        return Err(damaged(format!(
            "its sha256 is {digest}, expected {} (a damaged or partial copy)",
            pin.so_sha256
        )));
    }
    write_stamp(&stamp, &id.stamp_text(&digest));
    remember(id);
    Ok(())
}

/// What makes a file "the same file" for the stamp: path, size, mtime (ns) and inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Identity {
    path: PathBuf,
    size: u64,
    mtime_ns: i128,
    dev: u64,
    ino: u64,
}

impl Identity {
    fn of(path: &Path, meta: &fs::Metadata) -> Identity {
        Identity {
            path: path.to_path_buf(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    fn stamp_text(&self, sha256: &str) -> String {
        format!(
            "size={}\nmtime_ns={}\ndev={}\nino={}\nsha256={sha256}\n",
            self.size, self.mtime_ns, self.dev, self.ino
        )
    }
}

fn verified() -> &'static Mutex<HashSet<Identity>> {
    static VERIFIED: OnceLock<Mutex<HashSet<Identity>>> = OnceLock::new();
    VERIFIED.get_or_init(|| Mutex::new(HashSet::new()))
}

fn remember(id: Identity) {
    verified()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id);
}

/// `dir/.<file>.verified` next to the plugin `dir/<file>`.
pub(crate) fn stamp_path(plugin: &Path) -> PathBuf {
    let name = plugin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    plugin.with_file_name(format!(".{name}.verified"))
}

fn read_stamp(stamp: &Path) -> Option<String> {
    let mut text = String::new();
    // A stamp is a few lines; anything bigger is not ours.
    File::open(stamp)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Best effort: written to a scratch name and renamed, so a reader never sees half a stamp.
fn write_stamp(stamp: &Path, text: &str) {
    let tmp = stamp.with_extension(format!("tmp-{}", std::process::id()));
    if fs::write(&tmp, text).is_err() || fs::rename(&tmp, stamp).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// sha256 of a file, as lowercase hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| RuntimeError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

// ---------------------------------------------------------------------------------------
// Any other file: an ELF shared object for this machine that defines GetPjrtApi.
// ---------------------------------------------------------------------------------------

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ET_REL: u16 = 1;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const ET_CORE: u16 = 4;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
const SHN_UNDEF: u16 = 0;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
/// `e_phnum` value meaning "the real count is in section 0's `sh_info`".
const PN_XNUM: u16 = 0xffff;
/// Symbol and string tables larger than this are not read (a plugin's are a few KiB; the
/// CPU plugin's .dynsym is 15 KB); a larger one is reported as malformed.
const MAX_TABLE_BYTES: u64 = 64 << 20;
const ENTRY_POINT: &[u8] = b"GetPjrtApi";

/// The ELF machine number of the machine we run on, if we know it.
fn host_machine() -> Option<(u16, &'static str)> {
    if cfg!(target_arch = "x86_64") {
        Some((62, "x86-64"))
    } else if cfg!(target_arch = "aarch64") {
        Some((183, "AArch64"))
    } else {
        None
    }
}

/// Bounds-checked positional reads of one file.
struct Reader<'a> {
    path: &'a Path,
    file: File,
    size: u64,
}

impl Reader<'_> {
    /// `len` bytes at `offset`; a range past the end is reported as truncation.
    fn bytes(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| self.malformed("an offset overflows"))?;
        if end > self.size {
            return Err(RuntimeError::PluginTruncated {
                path: self.path.to_path_buf(),
                size: self.size,
                needed: end,
            });
        }
        let len = usize::try_from(len).map_err(|_| self.malformed("a table is too large"))?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| RuntimeError::io(self.path, e))?;
        Ok(buf)
    }

    fn malformed(&self, what: &str) -> RuntimeError {
        not_a_plugin(
            self.path,
            format!("its ELF headers are malformed ({what}), so it is not a loadable library"),
        )
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// One section header, the fields we use.
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

impl Section {
    fn parse(b: &[u8]) -> Section {
        Section {
            kind: u32_at(b, 4),
            offset: u64_at(b, 24),
            size: u64_at(b, 32),
            link: u32_at(b, 40),
            info: u32_at(b, 44),
            entsize: u64_at(b, 56),
        }
    }
}

/// Refuses `path` unless it is an ELF shared object for this machine, not truncated, that
/// defines `GetPjrtApi` in its dynamic symbol table.
pub(crate) fn check_elf(path: &Path) -> Result<()> {
    check_elf_exporting(
        path,
        ENTRY_POINT,
        "PJRT plugin",
        "real plugins are hundreds of MB",
    )
}

/// Refuses `path` unless it is an ELF shared object for this machine, not truncated, that
/// defines `entry` in its dynamic symbol table: the checks a PJRT plugin gets (with
/// `GetPjrtApi`), for any shared library `what` (e.g. "MuJoCo library"), the messages
/// naming `what`, `entry` and the `typical` size.
///
/// # Errors
///
/// [`RuntimeError::NotAPlugin`] or [`RuntimeError::PluginTruncated`] saying what is wrong,
/// or [`RuntimeError::Io`] when the file cannot be read.
pub fn check_elf_exporting(path: &Path, entry: &[u8], what: &str, typical: &str) -> Result<()> {
    let file = File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let size = file
        .metadata()
        .map_err(|e| RuntimeError::io(path, e))?
        .len();
    let r = Reader { path, file, size };
    let mut ident = [0u8; EHDR_SIZE];
    let head_len = usize::try_from(size.min(EHDR_SIZE as u64)).unwrap_or(EHDR_SIZE);
    r.file
        .read_exact_at(&mut ident[..head_len], 0)
        .map_err(|e| RuntimeError::io(path, e))?;
    if head_len < 4 || ident[..4] != ELF_MAGIC {
        return Err(not_a_plugin(
            path,
            "it is not an ELF shared object (it does not start with the ELF magic \\x7fELF)",
        ));
    }
    if head_len < EHDR_SIZE {
        return Err(RuntimeError::PluginTruncated {
            path: path.to_path_buf(),
            size,
            needed: EHDR_SIZE as u64,
        });
    }
    let h = ident;
    if h[4] != ELFCLASS64 || h[5] != ELFDATA2LSB {
        return Err(not_a_plugin(
            path,
            "it is a 32-bit or big-endian ELF file; shardes loads 64-bit little-endian plugins",
        ));
    }
    let e_type = u16_at(&h, 16);
    if e_type != ET_DYN {
        let what = match e_type {
            ET_REL => "an object file (.o)",
            ET_EXEC => "an executable",
            ET_CORE => "a core dump",
            _ => "an ELF file of unknown type",
        };
        return Err(not_a_plugin(
            path,
            format!("it is not an ELF shared object but {what}"),
        ));
    }
    let machine = u16_at(&h, 18);
    if let Some((ours, name)) = host_machine() {
        if machine != ours {
            return Err(not_a_plugin(
                path,
                format!(
                    "it is built for another machine (ELF e_machine {machine}, this is {name})"
                ),
            ));
        }
    }
    if size < MIN_PLUGIN_BYTES {
        return Err(not_a_plugin(
            path,
            format!(
                "it is too small to be a {what} ({size} bytes; {typical}, the smallest \
                 accepted is {MIN_PLUGIN_BYTES})"
            ),
        ));
    }
    let phoff = u64_at(&h, 32);
    let shoff = u64_at(&h, 40);
    let phentsize = u64::from(u16_at(&h, 54));
    let mut phnum = u64::from(u16_at(&h, 56));
    let shentsize = u64::from(u16_at(&h, 58));
    let mut shnum = u64::from(u16_at(&h, 60));
    if shoff != 0 && shentsize != SHDR_SIZE as u64 {
        return Err(r.malformed("section header size is not 64"));
    }
    // Extended numbering: counts that do not fit 16 bits live in section header 0.
    if shoff != 0 && (shnum == 0 || phnum == u64::from(PN_XNUM)) {
        let s0 = Section::parse(&r.bytes(shoff, SHDR_SIZE as u64)?);
        if shnum == 0 {
            shnum = s0.size;
        }
        if phnum == u64::from(PN_XNUM) {
            phnum = u64::from(s0.info);
        }
    }
    if phnum == 0 {
        return Err(r.malformed("no program headers"));
    }
    if phentsize != PHDR_SIZE as u64 {
        return Err(r.malformed("program header size is not 56"));
    }
    // Everything the headers say is in the file must be: the furthest end is what a
    // truncated file lacks, reported as one number.
    let mut needed = 0u64;
    let end_of = |off: u64, len: u64| off.checked_add(len).ok_or_else(|| r.malformed("overflow"));
    let phdrs = r.bytes(phoff, phnum * phentsize)?;
    for ph in phdrs.chunks_exact(PHDR_SIZE) {
        let kind = u32_at(ph, 0);
        if kind == PT_LOAD || kind == PT_DYNAMIC {
            needed = needed.max(end_of(u64_at(ph, 8), u64_at(ph, 32))?);
        }
    }
    let mut sections = Vec::new();
    if shoff != 0 && shnum != 0 {
        let table_len = shnum
            .checked_mul(SHDR_SIZE as u64)
            .ok_or_else(|| r.malformed("section count overflows"))?;
        needed = needed.max(end_of(shoff, table_len)?);
        if needed <= size {
            let table = r.bytes(shoff, table_len)?;
            sections = table.chunks_exact(SHDR_SIZE).map(Section::parse).collect();
            for s in &sections {
                if s.kind != SHT_NOBITS {
                    needed = needed.max(end_of(s.offset, s.size)?);
                }
            }
        }
    }
    if needed > size {
        return Err(RuntimeError::PluginTruncated {
            path: path.to_path_buf(),
            size,
            needed,
        });
    }
    if sections.is_empty() {
        // Section headers were stripped (rare for shared objects); the loader then reads the
        // symbols through the dynamic segment, and `dlsym` reports a missing entry point.
        return Ok(());
    }
    if exports_entry_point(&r, &sections, entry)? {
        Ok(())
    } else {
        Err(not_a_plugin(
            path,
            format!(
                "it does not export {} (the entry point every {what} has)",
                String::from_utf8_lossy(entry)
            ),
        ))
    }
}

/// Whether the dynamic symbol table defines a global or weak `entry`.
fn exports_entry_point(r: &Reader<'_>, sections: &[Section], entry: &[u8]) -> Result<bool> {
    let Some(dynsym) = sections.iter().find(|s| s.kind == SHT_DYNSYM) else {
        return Ok(false);
    };
    if dynsym.entsize != SYM_SIZE as u64 {
        return Err(r.malformed(".dynsym entry size is not 24"));
    }
    let strtab = usize::try_from(dynsym.link)
        .ok()
        .and_then(|i| sections.get(i))
        .ok_or_else(|| r.malformed(".dynsym links to no string table"))?;
    if dynsym.size > MAX_TABLE_BYTES || strtab.size > MAX_TABLE_BYTES {
        return Err(r.malformed("the dynamic symbol table is implausibly large"));
    }
    let syms = r.bytes(dynsym.offset, dynsym.size)?;
    let strs = r.bytes(strtab.offset, strtab.size)?;
    for sym in syms.chunks_exact(SYM_SIZE) {
        let name_at = u32_at(sym, 0) as usize;
        let bind = sym[4] >> 4;
        let shndx = u16_at(sym, 6);
        if shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) {
            continue;
        }
        let Some(rest) = strs.get(name_at..) else {
            continue;
        };
        let name = rest.split(|&b| b == 0).next().unwrap_or(rest);
        if name == entry {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_plugins_are_recognised_by_their_cache_location_only() {
        let root = Path::new("/any/root");
        for p in &NAMED {
            assert_eq!(pinned_for(&p.cached_path(root)), Some(p));
        }
        let cpu = super::super::CPU.cached_path(root);
        assert_eq!(pinned_for(&cpu.with_file_name("other.so")), None);
        assert_eq!(pinned_for(Path::new("/x/xla_cpu_pjrt.so")), None);
    }

    #[test]
    fn the_stamp_lives_next_to_the_plugin() {
        assert_eq!(
            stamp_path(Path::new("/c/d/xla_cpu_pjrt.so")),
            Path::new("/c/d/.xla_cpu_pjrt.so.verified")
        );
    }

    #[test]
    fn the_real_plugin_passes_the_elf_checks() {
        let real = super::super::locate(None).expect("a PJRT plugin");
        check_elf(&real).unwrap();
    }

    /// A good copy is hashed once, leaves a stamp, and a stamp that no longer matches the
    /// file (here: a different recorded size) is not trusted.
    #[test]
    fn a_verified_pinned_copy_leaves_a_stamp() {
        let cpu = &super::super::CPU;
        // The pinned copy in the cache, not what `SHARDES_PJRT_PLUGIN` may name (a run of
        // the suite on another plugin sets it).
        let real = match super::super::cache_root().map(|root| cpu.cached_path(&root)) {
            Ok(cached) if cached.is_file() => cached,
            _ => super::super::locate(None).expect("a PJRT plugin"),
        };
        if fs::metadata(&real).ok().map(|m| m.len()) != cpu.so_size {
            eprintln!("skipped: {} is not the pinned CPU plugin", real.display());
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let copy = cpu.cached_path(root.path());
        fs::create_dir_all(copy.parent().unwrap()).unwrap();
        // A hard link is a full-size copy for free; skip where the cache is elsewhere.
        if fs::hard_link(&real, &copy).is_err() {
            eprintln!("skipped: cannot hard-link the plugin into a temporary directory");
            return;
        }
        verify_pinned(cpu, &copy).unwrap();
        let stamp = fs::read_to_string(stamp_path(&copy)).unwrap();
        assert!(
            stamp.contains(&format!("sha256={}", cpu.so_sha256)),
            "{stamp}"
        );
        assert!(stamp.contains("size=259284552"), "{stamp}");
        let id = Identity::of(&copy, &fs::metadata(&copy).unwrap());
        assert_eq!(stamp, id.stamp_text(cpu.so_sha256));
        let stale = Identity { size: 1, ..id };
        assert_ne!(
            read_stamp(&stamp_path(&copy)),
            Some(stale.stamp_text(cpu.so_sha256))
        );
    }
}
