//! `hvstats bench`: runs the `hvstats-bench` development tool, as git runs `git-<name>`.
//!
//! What hvstats costs is measured by a tool of its own, so that the shipped binary links no
//! benchmark rows nor test fixtures. This command looks for the `hvstats-bench` executable next
//! to the running `hvstats` executable (where `cargo build` and `cargo install` put both), then on
//! `PATH`, and replaces itself with it, handing over every argument (`hvstats bench --help` is
//! its help); its output and exit status are the tool's. Without the tool it says how to get it
//! and exits 1.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

/// The tool's executable name.
pub(crate) const TOOL: &str = "hvstats-bench";

/// Flags of `hvstats bench`: all of them the tool's.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true, disable_version_flag = true)]
pub(crate) struct Args {
    /// The arguments of `hvstats-bench` (`hvstats bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    args: Vec<OsString>,
}

/// True when `path` is a file someone may execute.
fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The tool next to `exe`, else in a directory of `path` (a `PATH` value).
fn locate(exe: Option<&Path>, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let beside = exe.and_then(Path::parent).map(|dir| dir.join(TOOL));
    let on_path = path.into_iter().flat_map(std::env::split_paths).map(|dir| dir.join(TOOL));
    beside.into_iter().chain(on_path).find(|candidate| executable(candidate))
}

/// Runs `hvstats bench`: never returns when the tool is found and starts.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().ok();
    let Some(tool) = locate(exe.as_deref(), std::env::var_os("PATH").as_deref()) else {
        let beside = exe
            .as_deref()
            .and_then(Path::parent)
            .map_or("the hvstats executable".into(), |d| d.display().to_string());
        bail!(
            "`hvstats bench` runs the {TOOL} development tool, found neither in {beside} nor on PATH: \
             build it beside hvstats with `cargo build --release -p {TOOL}`, or install it with \
             `cargo install --path crates/{TOOL}`"
        );
    };
    let error = std::process::Command::new(&tool).args(&args.args).exec();
    Err(error).with_context(|| format!("cannot run {}", tool.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_beside_the_command_comes_before_path_and_only_an_executable_file_counts() {
        let root = std::env::temp_dir().join(format!("hvstats-bench-locate-{}", std::process::id()));
        let (beside, on_path, elsewhere) = (root.join("bin"), root.join("path"), root.join("other"));
        for dir in [&beside, &on_path, &elsewhere] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let exe = beside.join("hvstats");
        let path = std::env::join_paths([&elsewhere, &on_path]).unwrap();
        assert_eq!(locate(Some(&exe), Some(&path)), None, "nowhere yet");
        // A file that may not be executed, and a directory of the tool's name, do not count.
        std::fs::write(on_path.join(TOOL), "#!/bin/sh\n").unwrap();
        std::fs::create_dir(elsewhere.join(TOOL)).unwrap();
        assert_eq!(locate(Some(&exe), Some(&path)), None);
        std::fs::set_permissions(on_path.join(TOOL), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate(Some(&exe), Some(&path)), Some(on_path.join(TOOL)));
        std::fs::write(beside.join(TOOL), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(beside.join(TOOL), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate(Some(&exe), Some(&path)), Some(beside.join(TOOL)));
        assert_eq!(locate(None, Some(&path)), Some(on_path.join(TOOL)), "no executable path known");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
