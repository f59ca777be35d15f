import { once } from "node:events";
import { BindError, InvalidInputError } from "../sdk/contract/errors.ts";
import { parseSnapshot, type Cluster } from "../controller/planner/model/cluster.ts";
import { DaemonHosts } from "../controller/service/daemon-hosts.ts";
import { JournalError } from "../controller/service/journal.ts";
import { loadKeyring, type Keyring } from "../controller/service/keys.ts";
import { createLogger, type Logger } from "../sdk/contract/log.ts";
import { ControllerServer, type ServerOptions } from "../controller/service/server.ts";
import { DEFAULT_REPLAN_BACKOFF_MS, DEFAULT_STOP_LEAD_STEPS } from "../controller/service/controller.ts";
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
import { loadTopology, TOPOLOGY_FLAGS, TOPOLOGY_HELP } from "./topology.ts";
import { ExitCode, UsageError, addressFlag, intFlag, isLoopback, parseFlags, readSnapshotFile, secondsFlag, type Command, type Io } from "./io.ts";
import { outputDir } from "./output.ts";
import { metricsFlag, metricsHelp, serveMetrics } from "./metrics.ts";
import type { MetricsAddress, MetricsServer } from "../controller/metrics/http.ts";
import { SLURM_COMMENTS_FLAG, SLURM_COMMENTS_HELP, slurmCommentsFlag } from "./slurm.ts";

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

const help = `usage: monkeytree controller [--snapshot FILE | --topology FILE] [--bind ADDR] [--journal DIR] [--accept-journal-loss]
                             [--keys DIR | --insecure] [--require-vouch] [--plan-time-limit S]
                             [--heartbeat-timeout S] [--worker-heartbeat-timeout S]
                             [--lost-job-grace S] [--stop-lead N] [--replacement-wait S] [--replan-backoff S] [--metrics ADDR]
                             [--scheduler slurm [--slurm-conf FILE] [--scheduler-poll S] [--slurm-comments bounded|ignore]]

Runs the cluster's controller on a ZeroMQ ROUTER socket until SIGINT or SIGTERM; SIGHUP
reloads the --keys keyring. Launchers
register their workers and meet it at every iteration barrier; when a job starts or ends it
checks fragmentation, plans migrations and drives them step by step. Every state change is
journaled (fsync'd) before the controller acts on it; a restarted controller replays the
journal, rolls back moves that had not committed and finishes those that had.

options:
  --snapshot FILE        topology and bounds (as for \`monkeytree plan\`, with no jobs);
                         default: the --topology, else ${describeDefault()}
${TOPOLOGY_HELP}
  --bind ADDR            ZeroMQ address to listen on (default ${DEFAULT_BIND}, this machine only)
  --journal DIR          journal directory (default .monkeytree/journal)
  --accept-journal-loss  start from a journal that holds fewer records than its mark
                         (journal.mark) says were written, forgetting the lost ones, instead
                         of refusing it; only after restoring from a backup failed
  --keys DIR             the keyring \`monkeytree keys --dir DIR\` writes: the controller speaks
                         CURVE, admits only the keyring's client keys, and lets each do only
                         what its role allows (a daemon its host, a job its own workers, an
                         operator \`status\` and ending any job). Required to bind anything
                         but loopback. Its file must be readable by its owner only (0600).
                         SIGHUP reloads it: added keys are admitted, removed keys refused from
                         their next message on; a keyring that cannot be read is logged and
                         the one in use kept
  --insecure             bind another address without a keyring: anyone who reaches it may
                         register daemons and jobs, and so run commands on every host
  --require-vouch        take a job's new worker only on a host whose daemon vouched for a
                         launcher of that job (asked on the host's --vouch-socket), so a job
                         credential claims only hosts its job runs on; for hosts that tenants
                         share without --scheduler slurm, which checks allocations instead
  --plan-time-limit S    planner budget per event in seconds (default ${DEFAULT_PLAN_TIME_LIMIT_MS / 1000})
  --heartbeat-timeout S  declare a silent host daemon lost after S seconds (default 10)
  --worker-heartbeat-timeout S
                         declare a worker lost after S seconds without a word from its
                         launcher, which reports every ${DEFAULT_REPORT_INTERVAL_MS / 1000} s (default ${DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS / 1000}, at least ${MIN_WORKER_HEARTBEAT_TIMEOUT_S});
                         \`monkeytree status\` lists lost workers
  --lost-job-grace S     end a job S seconds after every one of its workers is lost, freeing
                         its hosts for other jobs (default ${DEFAULT_LOST_JOB_GRACE_MS / 1000})
  --stop-lead N          steps a job trains after its replacement is ready, before its workers
                         stop together (default ${DEFAULT_STOP_LEAD_STEPS}). The job trains on while the destination's
                         replacement starts (Python, torch, the script) and pauses only then
  --replacement-wait S   longest a job trains on while its move's replacement starts (default
                         ${DEFAULT_TIMEOUTS.starting / 1000}); past it the job pauses without waiting, and the move
                         waits for the replacement after its commit. 0 pauses at once
  --replan-backoff S     after a plan rolls back, and after a restart, plan again S seconds
                         later (default ${DEFAULT_REPLAN_BACKOFF_MS / 1000}): a cause that persists (a dead host) then
                         does not pause jobs over and over
  --scheduler slurm      Slurm owns the hosts (needs --topology, which names them as Slurm does):
                         jobs that did not register are counted where they run and never
                         moved, no worker moves onto a node Slurm could give another job, a
                         move's destination is held (a reservation) before it stages and its
                         source given back (the job shrinks) once it commits. See
                         docs/slurm.md
  --slurm-conf FILE      slurm.conf for Slurm's commands (default: $SLURM_CONF, then theirs)
  --scheduler-poll S     look at Slurm every S seconds (default 3)
${SLURM_COMMENTS_HELP}
${metricsHelp(25)}
  -h, --help             show this help

Every decision (a job seen, fragmentation found, a plan, each move's transitions, a rollback
and why, a worker or a daemon lost) is one JSON line in events.jsonl beside the journal
(rotated to events.jsonl.1 past 16 MiB); \`monkeytree status --follow\` streams them.

Each host runs \`monkeytree daemon --host H --connect ADDR\`; the controller sends it staging
and launch commands over this socket. A move to a host without a registered daemon rolls
back, and the job keeps running where it is.

exit codes: 0 stopped by a signal, 2 bad usage, input or journal, 3 internal error.`;

/** Slurm's side of the controller, once its commands are known to be installed here. */
function slurmAdapter(conf: string | undefined, comments: CommentPolicy, topology: NamedTopology, managed: () => ReadonlySet<string>, io: Io): SlurmAdapter {
  const slurm = new Slurm(conf === undefined ? {} : { conf });
  try {
    slurm.requireCommands();
  } catch (error) {
    if (error instanceof SlurmNotInstalledError) throw new InvalidInputError("--scheduler slurm", [{ path: "", message: error.detail }]);
    throw error;
  }
  return new SlurmAdapter({ slurm, topology, managed, comments, log: createLogger("slurm", (line) => io.err.write(`${line}\n`)) });
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
    const flags = controllerFlags(argv);
    const metricsAt = metricsFlag(flags.metrics);
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
    const journalDir = flags.journal ?? ".monkeytree/journal";
    outputDir("journal", journalDir);
    const metrics = metricsAt === null ? undefined : new ControllerMetrics();
    const server = await startServer({
      bind,
      journalDir,
      acceptJournalLoss: flags["accept-journal-loss"] ?? false,
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
    const scrape = await scrapeEndpoint(server, metrics, metricsAt, logger, io);
    if (keyring) io.out.write(`server key ${keyring.publicKey}, ${keyring.clients.length} client keys from ${flags.keys}\n`);
    await serveUntilStopped(server, scrape, flags.keys, logger, io);
    return ExitCode.ok;
  },
};

function controllerFlags(argv: string[]) {
  return parseFlags(argv, {
    snapshot: { type: "string" },
    bind: { type: "string" },
    journal: { type: "string" },
    "accept-journal-loss": { type: "boolean" },
    keys: { type: "string" },
    insecure: { type: "boolean" },
    "require-vouch": { type: "boolean" },
    "plan-time-limit": { type: "string" },
    "heartbeat-timeout": { type: "string" },
    "worker-heartbeat-timeout": { type: "string" },
    "lost-job-grace": { type: "string" },
    "stop-lead": { type: "string" },
    "replacement-wait": { type: "string" },
    "replan-backoff": { type: "string" },
    ...TOPOLOGY_FLAGS,
    scheduler: { type: "string" },
    "slurm-conf": { type: "string" },
    "scheduler-poll": { type: "string" },
    ...SLURM_COMMENTS_FLAG,
    metrics: { type: "string" },
  });
}

type ControllerFlags = ReturnType<typeof controllerFlags>;

/** How long the controller waits for what, and how far ahead a move stops its job: the flags', else the defaults. */
export function pacingFlags(
  flags: ControllerFlags,
): Pick<
  ServerOptions,
  "stopLeadSteps" | "timeouts" | "replanBackoffMs" | "planTimeLimitMs" | "heartbeatTimeoutMs" | "workerHeartbeatTimeoutMs" | "lostJobGraceMs"
> {
  return {
    stopLeadSteps: intFlag("stop-lead", flags["stop-lead"], DEFAULT_STOP_LEAD_STEPS, 0),
    timeouts: { ...DEFAULT_TIMEOUTS, starting: secondsFlag("replacement-wait", flags["replacement-wait"], DEFAULT_TIMEOUTS.starting / 1000, 0) },
    replanBackoffMs: secondsFlag("replan-backoff", flags["replan-backoff"], DEFAULT_REPLAN_BACKOFF_MS / 1000, 0),
    planTimeLimitMs: secondsFlag("plan-time-limit", flags["plan-time-limit"], DEFAULT_PLAN_TIME_LIMIT_MS / 1000, 0.01),
    heartbeatTimeoutMs: secondsFlag("heartbeat-timeout", flags["heartbeat-timeout"], 10, 0.1),
    workerHeartbeatTimeoutMs: secondsFlag(
      "worker-heartbeat-timeout",
      flags["worker-heartbeat-timeout"],
      DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS / 1000,
      MIN_WORKER_HEARTBEAT_TIMEOUT_S,
    ),
    lostJobGraceMs: secondsFlag("lost-job-grace", flags["lost-job-grace"], DEFAULT_LOST_JOB_GRACE_MS / 1000, 0),
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
  const bind = addressFlag("--bind", flags.bind ?? DEFAULT_BIND, "bind");
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
  if (flags.scheduler !== undefined && flags.scheduler !== "slurm") throw new UsageError(`--scheduler must be slurm, got "${flags.scheduler}"`);
  if (flags.scheduler === undefined && (flags["slurm-conf"] !== undefined || flags["scheduler-poll"] !== undefined || flags["slurm-comments"] !== undefined)) {
    throw new UsageError("--slurm-conf, --scheduler-poll and --slurm-comments go with --scheduler slurm");
  }
  if (flags.scheduler === "slurm" && !named) throw new UsageError("--scheduler slurm needs --topology: the racks with their hosts' names as Slurm knows them");
  const schedulerPollMs = secondsFlag("scheduler-poll", flags["scheduler-poll"], 3, 0.1);
  const comments = slurmCommentsFlag(flags["slurm-comments"]);
  const scheduler = flags.scheduler === "slurm" && named ? slurmAdapter(flags["slurm-conf"], comments, named, managed, io) : undefined;
  return scheduler ? { scheduler, schedulerPollMs } : {};
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
  at: MetricsAddress | null,
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
