//! `shardes completions SHELL`: a completion script on stdout, generated from the CLI's own
//! definition so it never falls behind a new subcommand or flag.

/// Arguments of `shardes completions`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Install, e.g.: bash: `shardes completions bash > ~/.local/share/bash-completion/completions/shardes`; \
zsh: `shardes completions zsh > ~/.zfunc/_shardes` (with ~/.zfunc on $fpath); \
fish: `shardes completions fish > ~/.config/fish/completions/shardes.fish`.")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// Prints the script for `args.shell`; `cli` is the whole command (`Cli::command()`), passed
/// in so this module needs nothing from `main`.
pub fn run(args: &CompletionsArgs, mut cli: clap::Command) {
    clap_complete::generate(args.shell, &mut cli, "shardes", &mut std::io::stdout());
}
