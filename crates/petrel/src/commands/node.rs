//! `petrel node`: the runtime and the agent in one process, the agent
//! talking CRI to the runtime over its socket exactly as it would to any
//! other runtime.

use std::process::ExitCode;

use clap::Args;

use super::agent::AgentFlags;
use super::runtime::RuntimeArgs;
use crate::config::FileConfig;

/// Flags of `petrel node`: the runtime's and the agent's.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub agent: AgentFlags,
}

impl NodeArgs {
    fn resolve(
        &self,
    ) -> anyhow::Result<(petrel_runtime::RuntimeConfig, petrel_agent::AgentConfig)> {
        let rt = self.runtime.resolve()?;
        let mut agent = match &self.runtime.config {
            Some(p) => FileConfig::load(p)?.agent,
            None => petrel_agent::AgentConfig::default(),
        };
        self.agent.apply(&mut agent);
        // The agent keeps its state under the runtime's root, talks to the
        // runtime's socket and puts pods under the runtime's cgroup.
        agent.root = rt.root.join("agent");
        agent.runtime_endpoint = format!("unix://{}", rt.socket_path().display());
        agent.cgroup_root = rt.default_cgroup_parent.clone();
        agent.validate()?;
        Ok((rt, agent))
    }
}

/// Runs runtime and agent until SIGTERM or SIGINT; containers keep running
/// unless `--drain-on-exit` (then the agent stops and removes its pods
/// before the runtime stops; a second signal exits at once).
pub fn main(args: NodeArgs) -> ExitCode {
    crate::observability::init(&args.runtime.log_level, args.runtime.log_json);
    let (rt_config, agent_config) = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("petrel node: {e:#}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("petrel node: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let signals = super::StopSignals::install();
        let (agent_stop, agent_stopped) = tokio::sync::watch::channel(false);
        let (runtime_stop, runtime_stopped) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut runtime = tokio::spawn(petrel_runtime::serve(rt_config, stopped(runtime_stopped)));
        let mut agent = tokio::spawn(petrel_agent::run(agent_config, stopped(agent_stopped)));
        let mut code = ExitCode::SUCCESS;
        let mut runtime_done = false;
        tokio::select! {
            () = signals.nth(1) => {}
            r = &mut runtime => {
                runtime_done = true;
                eprintln!("petrel node: runtime stopped: {}", describe(r));
                code = ExitCode::FAILURE;
            }
        }
        // The agent stops first (with --drain-on-exit it stops and removes
        // its pods through the runtime, which must still serve), then the
        // runtime drains its calls. A second signal stops the agent at once.
        let _ = agent_stop.send(true);
        let agent_result = tokio::select! {
            r = &mut agent => Some(r),
            () = signals.nth(2) => {
                tracing::warn!("second signal: exiting at once; pods are left as they are");
                agent.abort();
                // Gone before the runtime stops: its calls in flight are
                // cancelled, not waited for.
                let _ = (&mut agent).await;
                None
            }
        };
        match agent_result {
            Some(Ok(Err(e))) => {
                eprintln!("petrel node: agent: {e}");
                code = ExitCode::FAILURE;
            }
            Some(Err(e)) => eprintln!("petrel node: agent: {e}"),
            Some(Ok(Ok(()))) | None => {}
        }
        let _ = runtime_stop.send(true);
        if !runtime_done {
            if let Ok(Err(e)) = runtime.await {
                eprintln!("petrel node: runtime: {e}");
                code = ExitCode::FAILURE;
            }
        }
        code
    })
}

fn describe(
    r: Result<Result<(), petrel_runtime::server::ServeError>, tokio::task::JoinError>,
) -> String {
    match r {
        Ok(Ok(())) => "without error".to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}
