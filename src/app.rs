//! Wires parsed CLI arguments to the library: one function per subcommand, returning the
//! process exit status.

use crate::cli::{Cli, Command};
use crate::error::{Error, Result};

/// Runs the parsed command line and returns the exit status (see [`crate::error`]).
///
/// Errors: whatever the subcommand returns; the binary prints it and exits with
/// [`Error::exit_code`].
pub fn dispatch(cli: Cli) -> Result<i32> {
    init_tracing();
    match cli.command {
        Command::Overlay(args) => crate::overlay::cli_overlay(&args.options, &args.mountpoint, args.foreground),
        other => Err(Error::Failed(format!("{other:?}: not implemented yet"))),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAYERCACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
