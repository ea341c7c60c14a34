//! The `layercache` binary: parse the CLI, call the library, map errors to exit codes.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;

/// mount(8) canonicalises the source of `mount -t fuse.layercache overlay MNT` when a file
/// named `overlay` exists in its working directory, so mount.fuse3 may run us as
/// `layercache /some/dir/overlay MNT -o …`: treat that as the `overlay` subcommand.
fn normalized_args() -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if let Some(first) = args.get(1) {
        let p = Path::new(first);
        if p.is_absolute() && p.file_name().is_some_and(|n| n == "overlay") {
            args[1] = OsString::from("overlay");
        }
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
                let v = serde_json::json!({"error": err.to_string(), "exit": err.exit_code()});
                println!("{v}");
            }
            err.exit_code()
        }
    };
    std::process::exit(code);
}
