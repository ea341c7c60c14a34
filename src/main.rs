//! The `layercache` binary: parse the CLI, call the library, map errors to exit codes.

use clap::Parser;

fn main() {
    let cli = layercache::cli::Cli::parse();
    let code = match layercache::app::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("layercache: {err}");
            err.exit_code()
        }
    };
    std::process::exit(code);
}
