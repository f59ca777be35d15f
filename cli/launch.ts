import { hostname } from "node:os";
import { ControllerError, ControllerTimeoutError } from "../sdk/client/client.ts";
import { ControllerRefusedError } from "../sdk/client/connection.ts";
import { DEFAULT_HOLD_TIMEOUT_MS } from "../sdk/client/hold.ts";
import { createLogger } from "../sdk/contract/log.ts";
import { Launcher, LaunchError } from "../sdk/client/launch/launcher.ts";
import { adaptTorchrun, TorchrunArgsError } from "../sdk/client/launch/torchrun.ts";
import { replacementFromEnv, ReplacementEnvironmentError } from "../sdk/client/migrate.ts";
import { replacementName, ReplacementConfigError } from "../controller/daemon/replacements.ts";
import { defaultDaemonSocket } from "../sdk/contract/protocol/vouch.ts";
import { slurmTask, SlurmEnvironmentError, type SlurmTask } from "../controller/schedulers/slurm/environment.ts";
import { loadConfig, type Config } from "./config.ts";
import { checked, helpText, int, parseCommandFlags, seconds, str, type Flag, type FlagValues } from "./flags.ts";
import { CREDENTIALS_ENV, ExitCode, UsageError, addressFlag, credentialFlag, refusalAdvice, shmBytesFlag, type Command, type Io } from "./io.ts";
import { hostFlag, loadTopology } from "./topology.ts";

const DEFAULT_CHECKPOINT_BYTES = 256 * 2 ** 20;
const MIN_CHECKPOINT_BYTES = 4096;
const CHECKPOINT_BYTES = int(
  "N",
  "staging for this host's checkpoint, split among its local processes. The launcher holds that much shared memory from its " +
    "start, so a migration does not wait for it; a destination daemon needs this much free",
  { default: DEFAULT_CHECKPOINT_BYTES, min: MIN_CHECKPOINT_BYTES, show: `${DEFAULT_CHECKPOINT_BYTES}, 256 MiB` },
);

const FLAGS = {
  job: str("J", "the job's id, the same on every host (required outside srun)"),
  host: str("H", "this host's name in the topology, or its global index (required outside srun)"),
  dp: int("N", "hosts in each pipeline stage's DP group (required outside srun)", { min: 1 }),
  group: int("G", "this host's pipeline stage (default 0)", { min: 0 }),
  pp: int("N", "pipeline stages", { default: 1, min: 1 }),
  tp: int("N", "tensor-parallel degree; the DP rings a rack boundary carries", { default: 1, min: 1 }),
  topology: str("FILE", "the topology that names the hosts (a topology file or Slurm's topology.conf); default: the site configuration's"),
  connect: str(
    "ADDR",
    "the controller's ZeroMQ address (default $MONKEYTREE_CONTROLLER, then the site configuration's \"controller\", then tcp://127.0.0.1:5555)",
  ),
  credentials: str(
    "FILE",
    `the job's credential (job-J.json from \`monkeytree keys --job J\`), required when the controller has a keyring; default ` +
      `$${CREDENTIALS_ENV}. A replacement gets it from its daemon's --replacement command`,
  ),
  // Checked against /dev/shm as it is now, the default included: the launcher holds it from its start.
  "checkpoint-bytes": {
    ...CHECKPOINT_BYTES,
    parse: (raw, name) => shmBytesFlag(name, typeof raw === "string" ? raw : undefined, DEFAULT_CHECKPOINT_BYTES, MIN_CHECKPOINT_BYTES),
  } satisfies Flag<number>,
  "master-port": int("P", "the job's process group of generation g meets on P + g", { default: 29500, min: 1024, max: 65535 }),
  replacement: checked(
    "NAME",
    "the destination daemons' `--replacement NAME=COMMAND` that starts this job's replacements; without it, moves of the job's workers roll back",
    (value) => {
      try {
        return replacementName(value);
      } catch (error) {
        if (error instanceof ReplacementConfigError) throw new UsageError(error.message);
        throw error;
      }
    },
  ),
  "hold-timeout": seconds("S", "a stop not yet sealed is let go of, and training goes on, after this long without word from the controller", {
    default: DEFAULT_HOLD_TIMEOUT_MS / 1000,
    min: 1,
  }),
  "daemon-socket": str(
    "PATH",
    "the host daemon's local socket (its --vouch-socket), where the launcher first asks the daemon to vouch that it runs on this " +
      "host: a controller started with --require-vouch takes its worker only then (default " +
      `${defaultDaemonSocket(0).replace("-0.sock", "-H.sock")}; without a daemon there it registers unvouched)`,
  ),
};

const help = helpText({
  command: "monkeytree launch",
  table: FLAGS,
  tail: "-- torchrun [TORCHRUN OPTIONS] train.py [ARGS]",
  about: `Wraps a job's torchrun command on one host. It registers this host's worker with the
controller, which ranks the job's hosts along its DP ring order, and starts torchrun with a
local channel ($MONKEYTREE_CHANNEL) for the training processes. A script that calls the
Python hook (monkeytree.attach() and job.barrier(step, state_fn) each iteration) forms its
process group from the controller's assignment, re-forms it when the job changes, and saves
its state into a staging buffer when its worker migrates; the launcher sends that to the
destination, where the host's daemon starts the replacement with the command its operator
configured under --replacement NAME (typically this same \`monkeytree launch\` command without
--job, --host, --group, --dp, --pp, --tp and --connect). Jobs started without the launcher run
untouched.

Each host's torchrun runs as a single-node job with its own local rendezvous: the job-wide
process group comes from the controller (ranks follow the ring order, the master is node
rank 0's host), so remove --nnodes, --node-rank, --master-addr, --master-port, --rdzv-* and
--standalone from the torchrun command.

Under srun (one task per node: \`srun --ntasks-per-node 1 monkeytree launch -- torchrun …\`)
it needs none of --job, --host, --dp and --group: the job is SLURM_JOB_ID, the host the node
it runs on (SLURMD_NODENAME), --dp the allocation's node count divided by --pp, and the group
the node's place in SLURM_JOB_NODELIST divided by --dp.`,
  after: `Started by a daemon for a migration, the job, host, group and parallelism come from the
MONKEYTREE_* environment instead, and the processes load the staged checkpoint.

exit codes: torchrun's exit code (0 when training ended or this worker moved away),
1 the controller refused the worker or did not answer, 2 bad usage or a credential the
controller refused, 3 internal error.`,
});

export const command: Command = {
  summary: "wrap a torchrun command: controller-assigned ranks and migrations, never waiting on the controller",
  help,
  async run(argv, io) {
    const split = argv.indexOf("--");
    if (split < 0)
      throw new UsageError("give the torchrun command after `--`, e.g. monkeytree launch --job j --host 0 --dp 2 -- torchrun --nproc-per-node 8 train.py");
    const flags = parseCommandFlags(argv.slice(0, split), FLAGS);
    let replacement;
    let torchrun;
    try {
      replacement = replacementFromEnv();
      torchrun = adaptTorchrun(argv.slice(split + 1));
    } catch (error) {
      if (error instanceof ReplacementEnvironmentError || error instanceof TorchrunArgsError) throw new UsageError(error.message);
      throw error;
    }
    const config = await loadConfig();
    const { worker, parallelism } = replacement
      ? {
          worker: { job: replacement.MONKEYTREE_JOB, group: replacement.MONKEYTREE_GROUP, host: replacement.MONKEYTREE_HOST },
          parallelism: { tp: replacement.MONKEYTREE_TP, pp: replacement.MONKEYTREE_PP, dp: replacement.MONKEYTREE_DP },
        }
      : await freshIdentity(flags, config);
    const credential = credentialFlag(flags.credentials) ?? (config.credentials === undefined ? undefined : credentialFlag(config.credentials));
    if (credential && !(credential.credential.principal.role === "job" && credential.credential.principal.job === worker.job)) {
      throw new UsageError(
        `${credential.path} is not job ${JSON.stringify(worker.job)}'s credential; give --credentials the job-${worker.job}.json that \`monkeytree keys --job ${worker.job}\` wrote`,
      );
    }
    const log = createLogger(`launch ${worker.job}@${worker.host}`, (line) => io.err.write(`${line}\n`));
    const launcher = new Launcher({
      controller: replacement?.MONKEYTREE_CONTROLLER ?? controllerFlag(flags.connect, config),
      ...(credential ? { credential: credential.credential } : {}),
      worker,
      parallelism,
      checkpointBytes: flags["checkpoint-bytes"],
      masterPortBase: flags["master-port"],
      holdTimeoutMs: flags["hold-timeout"],
      torchrun,
      replacement,
      ...(flags.replacement === undefined ? {} : { replacementName: flags.replacement }),
      daemonSocket: flags["daemon-socket"] ?? defaultDaemonSocket(worker.host),
      log,
    });
    log.info(
      () => `${replacement ? `replacement for migration ${replacement.MONKEYTREE_MIGRATION}` : "launching"} on ${hostname()}: ${torchrun.argv.join(" ")}`,
    );
    return runLauncher(launcher, io, (error) =>
      refusalAdvice(error, credential?.path, `the job-${worker.job}.json that \`monkeytree keys --job ${worker.job}\` wrote`),
    );
  },
};

/**
 * Runs `launcher` with SIGINT and SIGTERM passed on to torchrun, and its exit code; a failure
 * the user can act on is one line on stderr (`advice` words a refused handshake).
 */
async function runLauncher(launcher: Launcher, io: Io, advice: (error: ControllerRefusedError) => string): Promise<ExitCode> {
  const forward = (signal: NodeJS.Signals) => () => launcher.terminate(signal);
  const onInt = forward("SIGINT");
  const onTerm = forward("SIGTERM");
  process.on("SIGINT", onInt);
  process.on("SIGTERM", onTerm);
  try {
    return (await launcher.run()) as ExitCode;
  } catch (error) {
    if (error instanceof LaunchError) {
      io.err.write(`monkeytree launch: ${error.message}\n`);
      return ExitCode.usage;
    }
    if (error instanceof ControllerRefusedError) {
      io.err.write(`monkeytree launch: ${advice(error)}\n`);
      return ExitCode.usage;
    }
    // A refused registration (a rolled-back move's replacement, a conflicting placement) or no controller.
    if (error instanceof ControllerError || error instanceof ControllerTimeoutError) {
      io.err.write(`monkeytree launch: ${error.message}\n`);
      return ExitCode.findings;
    }
    throw error;
  } finally {
    process.off("SIGINT", onInt);
    process.off("SIGTERM", onTerm);
  }
}

/** The controller's address: --connect, else $MONKEYTREE_CONTROLLER, else the site configuration's, each checked as given. */
function controllerFlag(connect: string | undefined, config: Config): string {
  if (connect !== undefined) return addressFlag("--connect", connect, "connect");
  const env = process.env.MONKEYTREE_CONTROLLER;
  if (env) return addressFlag("$MONKEYTREE_CONTROLLER", env, "connect");
  return config.controller ?? "tcp://127.0.0.1:5555";
}

type LaunchFlags = Pick<FlagValues<typeof FLAGS>, "job" | "host" | "group" | "dp" | "pp" | "tp" | "topology">;

/** A fresh launcher's job, host, group and parallelism: from the flags, else from srun's environment. */
async function freshIdentity(flags: LaunchFlags, config: Config) {
  let task: SlurmTask | null;
  try {
    task = slurmTask(process.env);
  } catch (error) {
    if (error instanceof SlurmEnvironmentError) throw new UsageError(error.message);
    throw error;
  }
  const job = flags.job ?? task?.job;
  if (!job) throw new UsageError("--job is required outside srun: the job's id, the same on every host");
  const hostRaw = flags.host ?? task?.node;
  if (hostRaw === undefined) throw new UsageError("--host is required outside srun: this host's name in the topology, or its global index");
  const host = hostFlag(hostRaw, await loadTopology({ topology: flags.topology }, config, true));
  const { pp, tp } = flags;
  let dp: number;
  if (flags.dp !== undefined) dp = flags.dp;
  else if (!task) throw new UsageError("--dp is required");
  else {
    dp = task.nodes.length / pp;
    if (!Number.isInteger(dp)) throw new UsageError(`the allocation has ${task.nodes.length} nodes, which --pp ${pp} does not divide: give --dp`);
  }
  // Stages are consecutive runs of the allocation's nodes, as srun lists them.
  const group = flags.group ?? (task ? Math.floor(task.nodes.indexOf(task.node) / dp) : 0);
  return { worker: { job, group, host }, parallelism: { tp, pp, dp } };
}
