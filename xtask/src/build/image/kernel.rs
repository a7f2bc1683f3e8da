//! The guest kernel: Debian's linux-source-6.12, our patches, tinyconfig plus
//! our fragment, built with Debian's rustc-web and the pinned bindgen.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::arch::Arch;
use crate::build::cache::{self, Entry, Key};
use crate::build::deps;
use crate::cmd::{self, Step};

/// Bump when the steps below change in a way that changes the result.
const RECIPE: &str = "kernel-1";
const SOURCE_PACKAGE: &str = "linux-source-6.12";
const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";
/// The toolchain the kernel's Rust needs (rustup's has no rust-src).
pub const RUSTC: &str = "/usr/bin/rustc";
const RUSTDOC: &str = "/usr/bin/rustdoc";
/// The fragment every variant starts from.
const BASE_FRAGMENT: &str = "config.fragment";
/// The arm64 kernel's fragment, merged alone (BASE_FRAGMENT is x86's).
const ARM64_FRAGMENT: &str = "arm64.fragment";

/// Which guest kernel: the normal one, the debug one (lockdep, RCU and
/// atomic-sleep checking, list debugging, KFENCE, debugobjects) that the
/// kernel-patch tests use, the sanitizer one (the debug one with KCSAN),
/// or the one with DWARF debug information for gdb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Normal,
    Debug,
    Sanitize,
    Gdb,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Normal => "normal",
            Variant::Debug => "debug",
            Variant::Sanitize => "sanitize",
            Variant::Gdb => "gdb",
        }
    }

    /// How long its x86 build takes on the 2-core development machine with
    /// nothing beside it (docs/building.md): KCSAN's instrumentation makes
    /// the sanitizer kernel the slowest.
    fn x86_build_time(self) -> &'static str {
        match self {
            Variant::Normal => "about 3.5 min",
            Variant::Debug | Variant::Gdb => "about 4 min",
            Variant::Sanitize => "about 5.5 min",
        }
    }

    /// Whether the kernel has the debug fragment's checking (lockdep,
    /// debugobjects, hotplug fail injection, ...).
    pub fn is_debug(self) -> bool {
        self.extra_fragments().contains(&"debug.fragment")
    }

    /// The fragments merged after `config.fragment`, in order.
    fn extra_fragments(self) -> &'static [&'static str] {
        match self {
            Variant::Normal => &[],
            Variant::Debug => &["debug.fragment"],
            Variant::Sanitize => &["debug.fragment", "sanitize.fragment"],
            Variant::Gdb => &["gdb.fragment"],
        }
    }

    /// What `make` builds: the vmlinux perfbed boots (PVH, under QEMU and
    /// perfbed-vmm alike), `modules` for the Module.symvers the out-of-tree
    /// module links against, and for gdb the `lx-*` scripts. Not x86's
    /// default `bzImage`: an XZ-compressed copy of the vmlinux and its
    /// decompressor, which nothing boots.
    fn make_targets(self) -> &'static [&'static str] {
        match self {
            Variant::Gdb => &["vmlinux", "modules", "scripts_gdb"],
            _ => &["vmlinux", "modules"],
        }
    }

    /// The config fragments merged onto tinyconfig, in order.
    fn fragments(self, arch: Arch) -> Vec<&'static str> {
        let base = match arch {
            Arch::X86_64 => BASE_FRAGMENT,
            Arch::Arm64 => ARM64_FRAGMENT,
        };
        std::iter::once(base)
            .chain(self.extra_fragments().iter().copied())
            .collect()
    }
}

/// What `make` builds for `arch`: x86's [`Variant::make_targets`]; on
/// arm64 the uncompressed `Image` QEMU's `virt` board boots (it passes the
/// device tree in x0 only to a Linux image, not to an ELF `vmlinux`).
fn make_targets(variant: Variant, arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => variant.make_targets(),
        Arch::Arm64 => &["Image", "modules"],
    }
}

/// The image a guest boots, in a built tree.
fn boot_image(tree: &Path, arch: Arch) -> PathBuf {
    match arch {
        Arch::X86_64 => tree.join("vmlinux"),
        Arch::Arm64 => tree.join("arch/arm64/boot/Image"),
    }
}

/// A built kernel tree in the cache.
pub struct Kernel {
    /// The tree, configured and built: out-of-tree modules build against it.
    pub tree: PathBuf,
    /// The image the guest boots: x86's PVH-bootable ELF `vmlinux`, arm64's
    /// `Image`.
    pub vmlinux: PathBuf,
    /// `uname -r` of this kernel.
    pub release: String,
    /// The cache key, which the module's key builds on.
    pub key: String,
    /// A key of the tree's sources alone (source package and patches, not
    /// the configuration): what tools built from the tree, perf, key on.
    pub source: String,
    /// What the tree is built for.
    pub arch: Arch,
}

impl Kernel {
    /// make, with the toolchain the kernel's Rust needs, for `arch`:
    /// cross-compiled with Debian's gcc for it, the
    /// kernel's Rust for the target the arch's Makefile names.
    pub fn make_for(tree: &Path, arch: Arch) -> Result<Command> {
        let mut make = Command::new("make");
        make.arg("-C").arg(tree);
        if let Some(cross) = arch.cross_compile() {
            make.arg(format!("ARCH={}", arch.kernel_arch()))
                .arg(format!("CROSS_COMPILE={cross}"));
        }
        make.args([
            format!("RUSTC={RUSTC}"),
            format!("HOSTRUSTC={RUSTC}"),
            format!("RUSTDOC={RUSTDOC}"),
            format!("BINDGEN={}", deps::bindgen()?.display()),
        ]);
        // rustup's proxies read these; the kernel must use Debian's rustc alone.
        make.env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        Ok(make)
    }
}

/// Paths to the kernel's inputs in the work tree.
pub fn images_dir(workspace: &Path) -> PathBuf {
    workspace.join("images/kernel")
}

/// The files a kernel is built from, read once: the key hashes these bytes
/// and the build uses these bytes, so a file edited while a build runs
/// cannot end up in an entry named after its old contents.
struct Inputs {
    /// (file name, contents): the config fragments in merge order.
    fragments: Vec<(String, Vec<u8>)>,
    /// (name, contents): the patches in the order they apply, each named by
    /// its path below `images/kernel/` (`patches/…`, `testbed-patches/…`,
    /// `mutants/…`).
    patches: Vec<(String, Vec<u8>)>,
}

/// Chooses the patches a kernel applies, given the series in order (a
/// planted-bug kernel applies others; see `stress::mutants`).
pub type ChoosePatches<'a> = &'a dyn Fn(&[PathBuf]) -> Result<Vec<PathBuf>>;

impl Inputs {
    fn read(
        workspace: &Path,
        variant: Variant,
        arch: Arch,
        choose: Option<ChoosePatches>,
    ) -> Result<Inputs> {
        let dir = images_dir(workspace);
        let fragments = variant
            .fragments(arch)
            .iter()
            .map(|name| {
                Ok((
                    name.to_string(),
                    fs::read(dir.join(name)).with_context(|| format!("reading {name}"))?,
                ))
            })
            .collect::<Result<_>>()?;
        let series = patches(workspace)?;
        let chosen = match choose {
            Some(choose) => choose(&series)?,
            None => series,
        };
        let patches = chosen
            .iter()
            .map(|patch| {
                let name = match patch.strip_prefix(&dir) {
                    Ok(below) => below.to_string_lossy().into_owned(),
                    Err(_) => format!(
                        "patches/{}",
                        patch
                            .file_name()
                            .context("a patch has a name")?
                            .to_string_lossy()
                    ),
                };
                Ok((
                    name,
                    fs::read(patch).with_context(|| format!("reading {}", patch.display()))?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Inputs { fragments, patches })
    }

    /// Writes the inputs into `dir` (fragments, then the patches below the
    /// folders they come from); returns their paths in order.
    fn write(&self, dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
        let write = |rel: String, bytes: &[u8]| -> Result<PathBuf> {
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let fragments = self
            .fragments
            .iter()
            .map(|(name, bytes)| write(name.clone(), bytes))
            .collect::<Result<_>>()?;
        let patches = self
            .patches
            .iter()
            .map(|(name, bytes)| write(name.clone(), bytes))
            .collect::<Result<_>>()?;
        Ok((fragments, patches))
    }
}

fn source_version() -> Result<String> {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", SOURCE_PACKAGE]))
        .with_context(|| format!("{SOURCE_PACKAGE} is not installed; run `cargo xtask deps`"))
}

/// The tree's sources: the source package and the patches.
fn source_key(inputs: &Inputs) -> Result<Key> {
    let mut key = Key::new("kernel-source-1");
    key.add("source-package", source_version()?.as_bytes());
    for (name, bytes) in &inputs.patches {
        key.add(name, bytes);
    }
    Ok(key)
}

fn key(inputs: &Inputs, arch: Arch) -> Result<Key> {
    let mut key = Key::new(RECIPE);
    // x86's key names no arch: its entries predate arm64's.
    if arch != Arch::X86_64 {
        key.add("arch", arch.kernel_arch().as_bytes());
    }
    key.add("source-package", source_version()?.as_bytes());
    // The base fragment's historical name in the key is "fragment".
    for (name, bytes) in &inputs.fragments {
        key.add(
            if name == BASE_FRAGMENT {
                "fragment"
            } else {
                name
            },
            bytes,
        );
    }
    for (name, bytes) in &inputs.patches {
        key.add(name, bytes);
    }
    key.add(
        "rustc",
        cmd::output(Command::new(RUSTC).arg("--version").arg("--verbose"))?.as_bytes(),
    );
    key.add("bindgen", deps::BINDGEN_VERSION.as_bytes());
    key.add("gcc", deps::version_of(&arch.gcc())?.as_bytes());
    Ok(key)
}

/// Names a kernel tree the developer configured and built: perfbed boots its
/// `vmlinux` and builds its modules against it instead of its own cached
/// kernel. For working on the patches in a tree of one's own, where a rebuild
/// takes seconds, not the minutes of a fresh tree. The tree must carry
/// perfbed's patches; the variant asked for does not apply to it.
pub const KERNEL_TREE_ENV: &str = "PERFBED_KERNEL_TREE";

/// Builds something from the patched tree (given it and the kernel's
/// `source` key) while the kernel builds in it.
pub type Beside<'a, T> = &'a (dyn Fn(&Path, &str) -> Result<T> + Sync);

/// Returns the cached kernel, building it first if its inputs changed, or
/// the developer's own tree if [`KERNEL_TREE_ENV`] names one.
///
/// `choose` picks the patches from the series (all of them for `None`):
/// each choice is a kernel of its own in the cache.
///
/// If the kernel has to be built, `beside` runs on
/// a thread of its own once the tree is patched, while the kernel's make
/// runs: a kernel build leaves a core idle for long stretches (rustc builds
/// `core` and `kernel` alone, vmlinux links alone). Returns its result, or
/// `None` if the kernel was cached (the caller builds from `Kernel::tree`).
pub fn ensure_patched_beside<T: Send>(
    workspace: &Path,
    variant: Variant,
    choose: Option<ChoosePatches>,
    beside: Option<Beside<T>>,
) -> Result<(Kernel, Option<T>)> {
    ensure_arch(workspace, variant, Arch::X86_64, choose, beside)
}

/// The `variant` kernel for `arch` of the patches `choose` picks (all of
/// them for `None`), built if its inputs changed (arm64 has the normal and
/// the debug kernel, and perf is not built for it).
pub fn ensure_for_arch(
    workspace: &Path,
    variant: Variant,
    arch: Arch,
    choose: Option<ChoosePatches>,
) -> Result<Kernel> {
    let none: Option<Beside<()>> = None;
    Ok(ensure_arch(workspace, variant, arch, choose, none)?.0)
}

fn ensure_arch<T: Send>(
    workspace: &Path,
    variant: Variant,
    arch: Arch,
    choose: Option<ChoosePatches>,
    beside: Option<Beside<T>>,
) -> Result<(Kernel, Option<T>)> {
    if let Some(tree) = std::env::var_os(KERNEL_TREE_ENV).filter(|t| !t.is_empty()) {
        if choose.is_some() {
            anyhow::bail!("{KERNEL_TREE_ENV} names a tree of one's own: a kernel mutant needs perfbed's own build");
        }
        if arch != Arch::X86_64 {
            anyhow::bail!(
                "{KERNEL_TREE_ENV} names an x86 tree; unset it for --arch {}",
                arch.kernel_arch()
            );
        }
        return Ok((own_tree(Path::new(&tree))?, None));
    }
    let inputs = Inputs::read(workspace, variant, arch, choose)?;
    let key = key(&inputs, arch)?;
    let source = source_key(&inputs)?.hex();
    let entry = Entry::new("kernel", &key)?;
    let tree = entry.dir.join("linux");
    let mut built_beside = None;
    if !entry.is_ready() {
        built_beside = build(
            &inputs,
            variant,
            arch,
            &entry,
            &tree,
            beside.map(|f| (f, source.as_str())),
        )?;
    }
    let release = fs::read_to_string(tree.join("include/config/kernel.release"))
        .context("reading the kernel release")?
        .trim()
        .to_string();
    Ok((
        Kernel {
            vmlinux: boot_image(&tree, arch),
            tree,
            release,
            key: key.hex(),
            source,
            arch,
        },
        built_beside,
    ))
}

/// A built kernel tree of the developer's ([`KERNEL_TREE_ENV`]). Its key
/// (which the modules' keys build on) covers its configuration, its exported
/// symbols and when its `vmlinux` was linked.
fn own_tree(tree: &Path) -> Result<Kernel> {
    let tree = tree
        .canonicalize()
        .with_context(|| format!("{KERNEL_TREE_ENV}={}: no such folder", tree.display()))?;
    let vmlinux = tree.join("vmlinux");
    let read = |name: &str| {
        fs::read(tree.join(name)).with_context(|| {
            format!(
                "{KERNEL_TREE_ENV}={}: no {name}; configure and build the tree first",
                tree.display()
            )
        })
    };
    let mut key = Key::new("own-kernel-1");
    key.add("tree", tree.to_string_lossy().as_bytes());
    key.add(".config", &read(".config")?);
    key.add("Module.symvers", &read("Module.symvers")?);
    let linked = fs::metadata(&vmlinux)
        .and_then(|m| m.modified())
        .with_context(|| format!("{}", vmlinux.display()))?;
    key.add("vmlinux-mtime", format!("{linked:?}").as_bytes());
    let release = String::from_utf8_lossy(&read("include/config/kernel.release")?)
        .trim()
        .to_string();
    eprintln!(
        "==> using the kernel tree {} ({release}) from {KERNEL_TREE_ENV}",
        tree.display()
    );
    Ok(Kernel {
        vmlinux,
        tree,
        release,
        source: key.hex(),
        key: key.hex(),
        arch: Arch::X86_64,
    })
}

fn build<T: Send>(
    inputs: &Inputs,
    variant: Variant,
    arch: Arch,
    entry: &Entry,
    tree: &Path,
    beside: Option<(Beside<T>, &str)>,
) -> Result<Option<T>> {
    entry.begin()?;
    let title = match arch {
        Arch::X86_64 => format!(
            "building the {} guest kernel ({} on 2 cores)",
            variant.name(),
            variant.x86_build_time()
        ),
        _ => format!(
            "building the {} {} guest kernel",
            arch.kernel_arch(),
            variant.name()
        ),
    };
    let step = Step::start(&title, &entry.dir.join("build.log"))?;
    let (fragments, patches) = inputs.write(&entry.dir.join("inputs"))?;
    // Kconfig needs bindgen (Rust is only offered when it runs), the source
    // unpacking and patching do not: install it meanwhile.
    let prepared = std::thread::scope(|s| {
        let bindgen = s.spawn(deps::ensure_bindgen);
        let unpacked = unpack(&step, entry, tree, &patches);
        bindgen
            .join()
            .map_err(|_| anyhow::anyhow!("the bindgen install thread panicked"))??;
        unpacked
    });
    prepared?;
    std::thread::scope(|s| {
        let beside = beside.map(|(f, source)| s.spawn(move || f(tree, source)));
        let built = make(&step, variant, arch, tree, &fragments);
        let beside = beside
            .map(|t| {
                t.join().map_err(|_| {
                    anyhow::anyhow!("the thread building beside the kernel panicked")
                })?
            })
            .transpose();
        built?;
        entry.mark_ready()?;
        step.finish();
        beside
    })
}

/// Configures and builds the unpacked, patched tree.
fn make(
    step: &Step,
    variant: Variant,
    arch: Arch,
    tree: &Path,
    fragments: &[PathBuf],
) -> Result<()> {
    configure(step, arch, tree, fragments)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    step.run(
        Kernel::make_for(tree, arch)?
            .arg(format!("-j{jobs}"))
            .args(make_targets(variant, arch)),
    )?;
    warnings_are_errors(step.log())
}

/// The config fragments of `variant` for `arch`, in merge order, as they
/// are in the work tree.
pub fn fragment_paths(workspace: &Path, variant: Variant, arch: Arch) -> Vec<PathBuf> {
    let dir = images_dir(workspace);
    variant
        .fragments(arch)
        .iter()
        .map(|name| dir.join(name))
        .collect()
}

/// Configures the unpacked tree: tinyconfig, then `fragments` merged in
/// order; an option a fragment asks for that the result lacks is an error.
pub fn configure(step: &Step, arch: Arch, tree: &Path, fragments: &[PathBuf]) -> Result<()> {
    let kmake = || Kernel::make_for(tree, arch);
    step.run(kmake()?.arg("tinyconfig"))?;
    step.run(
        Command::new(tree.join("scripts/kconfig/merge_config.sh"))
            .current_dir(tree)
            .args(["-m", ".config"])
            .args(fragments),
    )?;
    step.run(kmake()?.arg("olddefconfig"))?;
    let got = fs::read_to_string(tree.join(".config"))?;
    for fragment in fragments {
        let dropped = dropped_options(&fs::read_to_string(fragment)?, &got);
        if !dropped.is_empty() {
            bail!(
                "the merged kernel .config lacks options that {} asks for (unmet dependencies?):\n  {}",
                fragment.display(),
                dropped.join("\n  ")
            );
        }
    }
    step.run(kmake()?.arg("rustavailable"))
}

/// The kernel source unpacked as `tree`, with the patches applied.
fn unpack(step: &Step, entry: &Entry, tree: &Path, patches: &[PathBuf]) -> Result<()> {
    unpack_source(step, &entry.dir, tree)?;
    for patch in patches {
        step.run(
            Command::new("patch")
                .args(["-p1", "--forward", "--batch", "-d"])
                .arg(tree)
                .arg("-i")
                .arg(patch),
        )
        .with_context(|| format!("applying {}", patch.display()))?;
    }
    Ok(())
}

/// The base source, unpacked in `parent` (on the same filesystem) and
/// renamed to `tree`.
pub fn unpack_source(step: &Step, parent: &Path, tree: &Path) -> Result<()> {
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    step.run(
        Command::new("tar")
            .arg("-xf")
            .arg(SOURCE_TARBALL)
            .arg("-C")
            .arg(parent),
    )?;
    fs::rename(parent.join("linux-source-6.12"), tree).context("renaming the unpacked tree")
}

/// The base the series applies to, as its cover letter names it: the
/// source package and its version.
pub fn base() -> Result<String> {
    Ok(format!("Debian {SOURCE_PACKAGE} {}", source_version()?))
}

/// The folders of kernel patches below `images/kernel/`, in the order they
/// apply: the series as it would be posted, then what only the testbed
/// needs (see each folder's README).
pub const PATCH_DIRS: [&str; 2] = ["patches", "testbed-patches"];

/// The kernel patches, in the order they apply: the `*.patch` files of each
/// of [`PATCH_DIRS`] in turn, sorted by name (other files there, such as a
/// README, are not patches).
pub fn patches(workspace: &Path) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    for dir in PATCH_DIRS {
        all.extend(patches_in(workspace, dir)?);
    }
    Ok(all)
}

/// The `*.patch` files of one of [`PATCH_DIRS`], sorted by name.
pub fn patches_in(workspace: &Path, dir: &str) -> Result<Vec<PathBuf>> {
    let mut patches = cache::files_below(&images_dir(workspace).join(dir))?;
    patches.retain(|p| p.extension().is_some_and(|e| e == "patch"));
    Ok(patches)
}

/// Options from the fragment whose value is not what the final .config has.
/// `# CONFIG_X is not set` lines ask for the option to be off.
pub fn dropped_options(fragment: &str, config: &str) -> Vec<String> {
    let value_of = |text: &str, name: &str| -> Option<String> {
        text.lines().find_map(|line| {
            let line = line.trim();
            if line == format!("# {name} is not set") {
                return Some("n".into());
            }
            line.strip_prefix(name)?
                .strip_prefix('=')
                .map(|v| v.to_string())
        })
    };
    let mut dropped = Vec::new();
    for line in fragment.lines().map(str::trim) {
        let (name, want) = if let Some(rest) = line
            .strip_prefix("# ")
            .and_then(|l| l.strip_suffix(" is not set"))
        {
            (rest.to_string(), "n".to_string())
        } else if line.starts_with("CONFIG_") {
            match line.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => continue,
            }
        } else {
            continue;
        };
        let got = value_of(config, &name).unwrap_or_else(|| "n".into());
        if got != want {
            dropped.push(format!("{name}: asked {want}, got {got}"));
        }
    }
    dropped
}

/// The kernel must build without warnings: a new one is how a patch's
/// mistake first shows.
fn warnings_are_errors(log: &Path) -> Result<()> {
    let text = fs::read_to_string(log)?;
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("warning:")).collect();
    if !warnings.is_empty() {
        bail!(
            "the kernel built with {} warning(s) (see {}):\n{}",
            warnings.len(),
            log.display(),
            warnings
                .iter()
                .take(10)
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dropped_options;

    #[test]
    fn dropped_options_are_found() {
        let fragment = "# comment\nCONFIG_A=y\nCONFIG_B=8\n# CONFIG_C is not set\nCONFIG_D=y\n";
        let config = "CONFIG_A=y\nCONFIG_B=4\nCONFIG_C=y\n# CONFIG_D is not set\n";
        assert_eq!(
            dropped_options(fragment, config),
            vec![
                "CONFIG_B: asked 8, got 4",
                "CONFIG_C: asked n, got y",
                "CONFIG_D: asked y, got n"
            ]
        );
        assert!(dropped_options(fragment, "CONFIG_A=y\nCONFIG_B=8\nCONFIG_D=y\n").is_empty());
    }
}
