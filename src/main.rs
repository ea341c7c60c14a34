//! The `layercache` binary: parse the CLI, call the library, map errors to exit codes.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;

/// `mount -t fuse.layercache SOURCE MNT -o …` (and an fstab line of that type) makes
/// mount.fuse3 run us as `layercache SOURCE MNT -o …`. SOURCE means nothing to an overlay (as
/// for fuse-overlayfs): any first argument that is not a subcommand, followed by a mountpoint
/// and `-o`, is taken as the `overlay` subcommand. (mount(8) also canonicalises a SOURCE such
/// as `overlay` into `/some/dir/overlay` when such a file exists in its working directory.)
fn normalized_args() -> Vec<OsString> {
    use clap::CommandFactory;
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let Some(first) = args.get(1).and_then(|a| a.to_str()) else {
        return args;
    };
    let cmd = layercache::cli::Cli::command();
    let known = first == "help"
        || cmd
            .get_subcommands()
            .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first));
    let has_o = args.iter().skip(3).any(|a| a == "-o");
    let any_source = !known && !first.starts_with('-') && args.len() >= 3 && has_o;
    let canonical_overlay = Path::new(first).is_absolute()
        && Path::new(first).file_name().is_some_and(|n| n == "overlay");
    if any_source || canonical_overlay {
        args[1] = OsString::from("overlay");
    }
    args
}

fn main() {
    let cli = layercache::cli::Cli::parse_from(normalized_args());
    let json = cli.global.json;
    let code = match layercache::app::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("layercache: {err}");
            if json {
                // With --json the error is also one JSON line on stdout, for machines.
                let mut v = serde_json::json!({"error": err.to_string(), "exit": err.exit_code()});
                // A run that got as far as having an id names it (its events carry it).
                if let Some(run) = layercache::telemetry::current_run() {
                    v["run"] = run.into();
                }
                println!("{v}");
            }
            err.exit_code()
        }
    };
    std::process::exit(code);
}
