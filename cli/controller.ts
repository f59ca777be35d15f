import { once } from "node:events";
import { BindError, InvalidInputError } from "../sdk/contract/errors.ts";
import { parseSnapshot, type Cluster } from "../controller/planner/model/cluster.ts";
import { DaemonHosts } from "../controller/service/daemon-hosts.ts";
import { JournalError } from "../controller/service/journal.ts";
import { loadKeyring, type Keyring } from "../controller/service/keys.ts";
import { createLogger, type Logger } from "../sdk/contract/log.ts";
import { ControllerServer, type ServerOptions } from "../controller/service/server.ts";
import { DEFAULT_REPLAN_BACKOFF_MS, DEFAULT_SCHEDULER_POLL_MS, DEFAULT_STOP_LEAD_STEPS } from "../controller/service/controller.ts";
import { DEFAULT_PLAN_TIME_LIMIT_MS } from "../controller/service/plan-thread.ts";
import { DEFAULT_TIMEOUTS } from "../controller/service/migration.ts";
import { DEFAULT_LOST_JOB_GRACE_MS, DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS } from "../controller/service/sessions.ts";
import { DEFAULT_REPORT_INTERVAL_MS } from "../sdk/client/agent.ts";
import { join } from "node:path";
import { JOURNAL_FILE } from "../controller/service/journal.ts";
import { ControllerMetrics } from "../controller/service/metrics.ts";
import { SlurmAdapter } from "../controller/schedulers/slurm/adapter.ts";
import { Slurm, SlurmNotInstalledError } from "../controller/schedulers/slurm/commands.ts";
import type { CommentPolicy } from "../controller/schedulers/slurm/view.ts";
import type { NamedTopology } from "../controller/planner/model/named-topology.ts";
import { loadConfig } from "./config.ts";
import { loadTopology, TOPOLOGY_FLAGS } from "./topology.ts";
import { bool, checked, helpText, int, parseCommandFlags, seconds, str, type Flag, type FlagValues } from "./flags.ts";
import { ExitCode, UsageError, addressFlag, isLoopback, readSnapshotFile, type Command, type Io } from "./io.ts";
import { outputDir } from "./output.ts";
import { METRICS_FLAG, serveMetrics } from "./metrics.ts";
import type { MetricsAddress, MetricsServer } from "../controller/metrics/http.ts";
import { SLURM_COMMENTS_FLAG, SLURM_CONF_FLAG } from "./slurm.ts";

/** 16 racks of 8 hosts with 8 GPUs (1,024 GPUs, the paper's simulated cluster), 8 uplinks each. */
const DEFAULT_SNAPSHOT = { topology: { racks: 16, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 8 }, jobs: [] };

function describeDefault(): string {
  const t = DEFAULT_SNAPSHOT.topology;
  return `${t.racks} racks × ${t.hostsPerRack} hosts × ${t.gpusPerHost} GPUs, ${t.uplinksPerRack} uplinks per rack`;
}

const DEFAULT_BIND = "tcp://127.0.0.1:5555";
/**
 * Launchers report on a fixed interval: a timeout under a few of them would declare lost a
 * worker whose report came late, and end a healthy job.
 */
const MIN_WORKER_HEARTBEAT_TIMEOUT_S = (4 * DEFAULT_REPORT_INTERVAL_MS) / 1000;

/** How long the controller waits for what, and how far ahead a move stops its job. */
export const PACING_FLAGS = {
  "plan-time-limit": seconds("S", "planner budget per event in seconds", { default: DEFAULT_PLAN_TIME_LIMIT_MS / 1000, min: 0.01 }),
  "heartbeat-timeout": seconds("S", "declare a silent host daemon lost after S seconds", { default: 10, min: 0.1 }),
  "worker-heartbeat-timeout": seconds(
    "S",
    `declare a worker lost after S seconds without a word from its launcher, which reports every ${DEFAULT_REPORT_INTERVAL_MS / 1000} s; ` +
      "`monkeytree status` lists lost workers",
    {
      default: DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS / 1000,
      min: MIN_WORKER_HEARTBEAT_TIMEOUT_S,
      show: `${DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS / 1000}, at least ${MIN_WORKER_HEARTBEAT_TIMEOUT_S}`,
    },
  ),
  "lost-job-grace": seconds("S", "end a job S seconds after every one of its workers is lost, freeing its hosts for other jobs", {
    default: DEFAULT_LOST_JOB_GRACE_MS / 1000,
    min: 0,
  }),
  "stop-lead": int(
    "N",
    "steps a job trains after its replacement is ready, before its workers stop together. The job trains on while the destination's " +
      "replacement starts (Python, torch, the script) and pauses only then",
    { default: DEFAULT_STOP_LEAD_STEPS, min: 0 },
  ),
  "replacement-wait": seconds(
    "S",
    "longest a job trains on while its move's replacement starts; past it the job pauses without waiting, and the move waits for " +
      "the replacement after its commit. 0 pauses at once",
    { default: DEFAULT_TIMEOUTS.starting / 1000, min: 0 },
  ),
  "replan-backoff": seconds(
    "S",
    "after a plan rolls back, and after a restart, plan again S seconds later: a cause that persists (a dead host) then does not pause jobs over and over",
    { default: DEFAULT_REPLAN_BACKOFF_MS / 1000, min: 0 },
  ),
} as const;

/** `flag`, but undefined when not given: flags that go with another are refused without it, which their defaults would hide. */
function unlessGiven<T>(flag: Flag<T>): Flag<T | undefined> {
  return { ...flag, parse: (raw, name) => (raw === undefined ? undefined : flag.parse(raw, name)) };
}

const FLAGS = {
  snapshot: str(
    "FILE",
    `topology and bounds (as for \`monkeytree plan\`, with no jobs); give it or --topology, not both. Default: the --topology, else ${describeDefault()}`,
  ),
  ...TOPOLOGY_FLAGS,
  bind: checked("ADDR", "ZeroMQ address to listen on", (address) => addressFlag("--bind", address, "bind"), {
    default: DEFAULT_BIND,
    show: `${DEFAULT_BIND}, this machine only`,
  }),
  // Made where the command gets to it, after every other check, so that a mistake elsewhere leaves no directory behind.
  journal: str("DIR", "journal directory", { default: ".monkeytree/journal" }),
  "accept-journal-loss": bool(
    "start from a journal that holds fewer records than its mark (journal.mark) says were written, forgetting the lost ones, " +
      "instead of refusing it; only after restoring from a backup failed",
  ),
  keys: str(
    "DIR",
    "the keyring `monkeytree keys --dir DIR` writes: the controller speaks CURVE, admits only the keyring's client keys, and lets " +
      "each do only what its role allows (a daemon its host, a job its own workers, an operator `status` and ending any job). " +
      "Required to bind anything but loopback. Its file must be readable by its owner only (0600). SIGHUP reloads it: added keys " +
      "are admitted, removed keys refused from their next message on; a keyring that cannot be read is logged and the one in use kept",
  ),
  insecure: bool(
    "bind another address without a keyring (not with --keys): anyone who reaches it may register daemons and jobs, and so run commands on every host",
  ),
  "require-vouch": bool(
    "take a job's new worker only on a host whose daemon vouched for a launcher of that job (asked on the host's --vouch-socket), " +
      "so a job credential claims only hosts its job runs on; for hosts that tenants share without --scheduler slurm, which " +
      "checks allocations instead",
  ),
  ...PACING_FLAGS,
  scheduler: checked(
    "slurm",
    "Slurm owns the hosts (needs --topology, which names them as Slurm does): jobs that did not register are counted where they " +
      "run and never moved, no worker moves onto a node Slurm could give another job, a move's destination is held (a " +
      "reservation) before it stages and its source given back (the job shrinks) once it commits. --slurm-conf, " +
      "--scheduler-poll and --slurm-comments go with it. See docs/slurm.md",
    (value): "slurm" => {
      if (value !== "slurm") throw new UsageError(`--scheduler must be slurm, got "${value}"`);
      return value;
    },
  ),
  "slurm-conf": SLURM_CONF_FLAG["slurm-conf"],
  "scheduler-poll": unlessGiven(seconds("S", "look at Slurm every S seconds", { default: DEFAULT_SCHEDULER_POLL_MS / 1000, min: 0.1 })),
  "slurm-comments": unlessGiven(SLURM_COMMENTS_FLAG["slurm-comments"]),
  ...METRICS_FLAG,
};

const help = helpText({
  command: "monkeytree controller",
  table: FLAGS,
  about: `Runs the cluster's controller on a ZeroMQ ROUTER socket until SIGINT or SIGTERM; SIGHUP
reloads the --keys keyring. Launchers register their workers and meet it at every iteration
barrier; when a job starts or ends it checks fragmentation, plans migrations and drives them
step by step. Every state change is journaled (fsync'd) before the controller acts on it; a
restarted controller replays the journal, rolls back moves that had not committed and
finishes those that had.`,
  after: `Every decision (a job seen, fragmentation found, a plan, each move's transitions, a rollback
and why, a worker or a daemon lost) is one JSON line in events.jsonl beside the journal
(rotated to events.jsonl.1 past 16 MiB); \`monkeytree status --follow\` streams them.

Each host runs \`monkeytree daemon --host H --connect ADDR\`; the controller sends it staging
and launch commands over this socket. A move to a host without a registered daemon rolls
back, and the job keeps running where it is.

exit codes: 0 stopped by a signal, 2 bad usage, input or journal, 3 internal error.`,
});

/** Slurm's side of the controller, once its commands are known to be installed here. */
function slurmAdapter(
  conf: string | undefined,
  comments: CommentPolicy | undefined,
  topology: NamedTopology,
  managed: () => ReadonlySet<string>,
  io: Io,
): SlurmAdapter {
  const slurm = new Slurm(conf === undefined ? {} : { conf });
  try {
    slurm.requireCommands();
  } catch (error) {
    if (error instanceof SlurmNotInstalledError) throw new InvalidInputError("--scheduler slurm", [{ path: "", message: error.detail }]);
    throw error;
  }
  return new SlurmAdapter({
    slurm,
    topology,
    managed,
    ...(comments === undefined ? {} : { comments }),
    log: createLogger("slurm", (line) => io.err.write(`${line}\n`)),
  });
}

/**
 * What SIGHUP does: reloads the keyring from `keysDir`, applying it whole or not at all (a
 * keyring that cannot be read, is not private or has another controller keypair is logged
 * and the one in use kept). Without --keys there is nothing to reload, and it is logged.
 */
function reloadOnHangup(server: ControllerServer, keysDir: string | undefined, logger: Logger): () => void {
  return () => {
    if (keysDir === undefined) {
      logger.info(() => "SIGHUP ignored: this controller has no keyring (--keys) to reload");
      return;
    }
    try {
      const { added, removed } = server.reloadKeyring(loadKeyring(keysDir));
      const names = (list: string[]) => (list.length ? list.join(", ") : "none");
      logger.info(() => `SIGHUP: reloaded the keyring from ${keysDir}: added ${names(added)}; revoked ${names(removed)}`);
    } catch (error) {
      logger.error(() => `SIGHUP: kept the keyring in use, since ${keysDir} cannot replace it: ${(error as Error).message}`);
    }
  };
}

export const command: Command = {
  summary: "run the cluster controller (ZeroMQ ROUTER, journaled)",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const pacing = pacingFlags(flags);
    const { cluster, named } = await controlledCluster(flags);
    const { bind, keyring } = listenFlags(flags);
    const logger = createLogger("controller", (line) => io.err.write(`${line}\n`));
    if (flags.insecure && !isLoopback(bind)) {
      logger.warn(() => `listening on ${bind} with --insecure: any client on the network can register daemons and jobs, and so owns every host`);
    }
    // The controller's started jobs are Slurm's jobs of the same id, and movable.
    let started: () => ReadonlySet<string> = () => new Set();
    const scheduling = schedulerFlags(flags, named, () => started(), io);
    const daemons = new DaemonHosts();
    const journalDir = flags.journal;
    outputDir("journal", journalDir);
    const metrics = flags.metrics === undefined ? undefined : new ControllerMetrics();
    const server = await startServer({
      bind,
      journalDir,
      acceptJournalLoss: flags["accept-journal-loss"],
      config: { kind: "config", topology: cluster.topology, lambda: cluster.lambda, podLambda: cluster.podLambda ?? null },
      transport: daemons,
      launcher: daemons,
      daemons,
      ...pacing,
      ...(flags["require-vouch"] ? { requireVouch: true } : {}),
      logger,
      ...scheduling,
      ...(named ? { unavailable: named.padding } : {}),
      ...(keyring ? { keyring } : {}),
      ...(metrics ? { observer: metrics } : {}),
    });
    started = () => new Set(server.controller.durable.jobs.keys());
    metrics?.attach(() => ({ ...server.controller.view(), journalPath: join(journalDir, JOURNAL_FILE) }));
    const scrape = await scrapeEndpoint(server, metrics, flags.metrics, logger, io);
    if (keyring) io.out.write(`server key ${keyring.publicKey}, ${keyring.clients.length} client keys from ${flags.keys}\n`);
    await serveUntilStopped(server, scrape, flags.keys, logger, io);
    return ExitCode.ok;
  },
};

type ControllerFlags = FlagValues<typeof FLAGS>;

/** The pacing flags' values as the server takes them. */
export function pacingFlags(
  flags: FlagValues<typeof PACING_FLAGS>,
): Pick<
  ServerOptions,
  "stopLeadSteps" | "timeouts" | "replanBackoffMs" | "planTimeLimitMs" | "heartbeatTimeoutMs" | "workerHeartbeatTimeoutMs" | "lostJobGraceMs"
> {
  return {
    stopLeadSteps: flags["stop-lead"],
    timeouts: { ...DEFAULT_TIMEOUTS, starting: flags["replacement-wait"] },
    replanBackoffMs: flags["replan-backoff"],
    planTimeLimitMs: flags["plan-time-limit"],
    heartbeatTimeoutMs: flags["heartbeat-timeout"],
    workerHeartbeatTimeoutMs: flags["worker-heartbeat-timeout"],
    lostJobGraceMs: flags["lost-job-grace"],
  };
}

/** The cluster to control: --snapshot's, --topology's (with its hosts' names) or the default, without jobs. */
async function controlledCluster(flags: ControllerFlags): Promise<{ cluster: Cluster; named: NamedTopology | null }> {
  if (flags.snapshot !== undefined && flags.topology !== undefined) throw new UsageError("--snapshot and --topology both give the topology: give one");
  const named = flags.snapshot === undefined ? await loadTopology(flags, await loadConfig()) : null;
  const cluster: Cluster =
    flags.snapshot !== undefined
      ? await readSnapshotFile(flags.snapshot)
      : parseSnapshot(
          named ? { topology: named.topology, lambda: named.lambda, podLambda: named.podLambda, jobs: [] } : DEFAULT_SNAPSHOT,
          named ? "topology" : "default topology",
        );
  if (cluster.groups.length) {
    throw new UsageError(`${flags.snapshot} lists jobs; the controller learns jobs from their workers' registrations, so give it a snapshot with "jobs": []`);
  }
  return { cluster, named };
}

/** Where the controller listens, and the keyring it admits clients by: required off loopback unless --insecure. */
function listenFlags(flags: ControllerFlags): { bind: string; keyring: Keyring | undefined } {
  const bind = flags.bind;
  if (flags.keys !== undefined && flags.insecure) throw new UsageError("--keys and --insecure contradict each other: give one");
  if (flags.keys === undefined && !flags.insecure && !isLoopback(bind)) {
    throw new UsageError(
      `refusing to listen on ${bind} without a keyring: anyone who reaches it could run commands on every host. ` +
        "Create keys with `monkeytree keys --dir keys --daemon 0-127 --job JOB --operator NAME` and pass --keys keys, " +
        "or pass --insecure on a network only trusted machines reach",
    );
  }
  return { bind, keyring: flags.keys === undefined ? undefined : loadKeyring(flags.keys) };
}

/** With --scheduler slurm, Slurm as the owner of the named hosts and how often to look at it; nothing without. */
function schedulerFlags(
  flags: ControllerFlags,
  named: NamedTopology | null,
  managed: () => ReadonlySet<string>,
  io: Io,
): Pick<ServerOptions, "scheduler" | "schedulerPollMs"> {
  if (flags.scheduler === undefined && (flags["slurm-conf"] !== undefined || flags["scheduler-poll"] !== undefined || flags["slurm-comments"] !== undefined)) {
    throw new UsageError("--slurm-conf, --scheduler-poll and --slurm-comments go with --scheduler slurm");
  }
  if (flags.scheduler === "slurm" && !named) throw new UsageError("--scheduler slurm needs --topology: the racks with their hosts' names as Slurm knows them");
  const scheduler = flags.scheduler === "slurm" && named ? slurmAdapter(flags["slurm-conf"], flags["slurm-comments"], named, managed, io) : undefined;
  const schedulerPollMs = flags["scheduler-poll"];
  return scheduler ? { scheduler, ...(schedulerPollMs === undefined ? {} : { schedulerPollMs }) } : {};
}

/** Starts the server; a journal it cannot open and an address it cannot bind are bad input. */
async function startServer(options: ServerOptions): Promise<ControllerServer> {
  try {
    return await ControllerServer.start(options);
  } catch (error) {
    if (error instanceof JournalError) {
      throw new InvalidInputError("journal", [{ path: "", message: error.message }]);
    }
    // The server says which address and what to do: a port in use, an address of another host.
    if (error instanceof BindError) throw new InvalidInputError("--bind", [{ path: "", message: error.message }]);
    throw error;
  }
}

/** Serves --metrics' scrape endpoint, where asked; one that cannot start closes the server first, so that the command's error leaves no socket or journal open. */
async function scrapeEndpoint(
  server: ControllerServer,
  metrics: ControllerMetrics | undefined,
  at: MetricsAddress | undefined,
  logger: Logger,
  io: Io,
): Promise<MetricsServer | null> {
  try {
    return metrics && at ? await serveMetrics(at, metrics.registry, logger, io) : null;
  } catch (error) {
    await server.close();
    throw error;
  }
}

/** Serves until SIGINT or SIGTERM, reloading the keyring on SIGHUP meanwhile, then closes the scrape endpoint and the server. */
async function serveUntilStopped(server: ControllerServer, scrape: MetricsServer | null, keysDir: string | undefined, logger: Logger, io: Io): Promise<void> {
  // Before the line that says it listens: whoever waits for that line may send SIGHUP at once.
  const hangup = reloadOnHangup(server, keysDir, logger);
  process.on("SIGHUP", hangup);
  io.out.write(`controller listening on ${server.endpoint}\n`);
  const signal = await Promise.race([once(process, "SIGINT"), once(process, "SIGTERM")]);
  process.off("SIGHUP", hangup);
  logger.info(() => `stopping on ${String(signal[0] ?? "signal")}`);
  await scrape?.close();
  await server.close();
}
