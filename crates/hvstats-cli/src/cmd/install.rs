//! `hvstats man` and `hvstats completions`: what a packager or an operator installs beside the
//! binary, generated from the same clap definitions as `--help`, so they never drift from it; the
//! man pages add the sections `--help` has no place for ([`crate::man_page`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Command;
use clap_complete::Shell;

use crate::output::{self, ExitStatus, out};

/// Flags of `hvstats man`.
#[derive(clap::Args, Debug)]
pub(crate) struct ManArgs {
    /// The directory to write the pages into (`hvstats.1`, then `hvstats-<command>.1` for each
    /// command), e.g. /usr/local/share/man/man1; created (with its parents) when missing.
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

/// Flags of `hvstats completions`.
#[derive(clap::Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for; the script is printed on standard output.
    #[arg(value_enum)]
    shell: Shell,
}

/// Writes a man page for `hvstats` and one for each of its commands into `--out-dir`.
///
/// # Errors
/// When the directory cannot be created, is not a directory, or a page cannot be written.
pub(crate) fn man(args: ManArgs, cli: Command) -> anyhow::Result<ExitCode> {
    if args.out_dir.exists() && !args.out_dir.is_dir() {
        anyhow::bail!("--out-dir {} is not a directory", args.out_dir.display());
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating --out-dir {}", args.out_dir.display()))?;
    let cli = cli.disable_help_subcommand(true);
    let mut written = Vec::new();
    for (name, page) in pages(&cli) {
        let mut roff = Vec::new();
        clap_mangen::Man::new(page).render(&mut roff).context("rendering a man page")?;
        let roff = crate::man_page::with_extra_sections(&String::from_utf8_lossy(&roff), &name);
        let path = args.out_dir.join(format!("{name}.1"));
        replace(&path, roff.as_bytes())?;
        written.push(path);
    }
    for path in written {
        out!("{}", path.display())?;
    }
    Ok(ExitStatus::Success.into())
}

/// `hvstats` and each of its commands, named as their pages are: a built command gives each
/// subcommand the display name `hvstats-top`, which the page's title and file take.
fn pages(cli: &Command) -> Vec<(String, Command)> {
    let mut cli = cli.clone();
    cli.build();
    let mut pages = vec![(cli.get_name().to_owned(), cli.clone())];
    for sub in cli.get_subcommands() {
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_owned();
        pages.push((name, sub.clone()));
    }
    pages
}

/// Writes `bytes` to `path` through a new file beside it, renamed over the old page: a link
/// planted at `path` is replaced, never followed.
fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("writing {}", path.display()))
    })
}

/// Prints the completion script of `--shell` for `cli`.
///
/// # Errors
/// When standard output cannot be written.
pub(crate) fn completions(args: CompletionsArgs, mut cli: Command) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    let name = cli.get_name().to_owned();
    clap_complete::generate(args.shell, &mut cli, name, &mut script);
    output::print(&String::from_utf8_lossy(&script))?;
    Ok(ExitStatus::Success.into())
}
