import { once } from "node:events";
import { hostname } from "node:os";
import { DaemonStartError, DEFAULT_HEARTBEAT_MS, HostDaemon, type DaemonOptions } from "../controller/daemon/daemon.ts";
import { parseReplacements, ReplacementConfigError, requireSetpriv, resolveTenant, type Tenant } from "../controller/daemon/replacements.ts";
import { CgroupConfigError, ownCgroup, ReplacementCgroups } from "../controller/daemon/cgroup.ts";
import { VouchSocket, VouchSocketError } from "../controller/daemon/vouch-socket.ts";
import { defaultDaemonSocket } from "../sdk/contract/protocol/vouch.ts";
import { createLogger, type Logger } from "../sdk/contract/log.ts";
import { DaemonMetrics } from "../controller/daemon/metrics.ts";
import type { MetricsServer } from "../controller/metrics/http.ts";
import { loadConfig } from "./config.ts";
import { checked, helpText, int, list, parseCommandFlags, required, seconds, str, type Flag, type FlagValues } from "./flags.ts";
import { METRICS_FLAG, serveMetrics } from "./metrics.ts";
import { hostFlag, loadTopology } from "./topology.ts";
import { ControllerRefusedError } from "../sdk/client/connection.ts";
import { InvalidInputError } from "../sdk/contract/errors.ts";
import { CREDENTIALS_ENV, ExitCode, UsageError, addressFlag, credentialFlag, isLoopback, refusalAdvice, shmBytesFlag, type Command, type Io } from "./io.ts";

const DEFAULT_STAGING_BYTES = 256 * 1024 * 1024;
/** With the controller on this machine, transfers need no other address. */
const DEFAULT_LISTEN = "127.0.0.1:0";

/** `--staging-bytes`: at most what /dev/shm holds, which `shmBytesFlag` checks of the default too, and says so. */
const STAGING_BYTES_FLAG: Flag<number> = {
  ...int("N", "the most checkpoint bytes staged at once, so the largest checkpoint the host accepts", {
    default: DEFAULT_STAGING_BYTES,
    min: 1,
    show: `${DEFAULT_STAGING_BYTES}, 256 MiB`,
  }),
  parse: (raw, name) => shmBytesFlag(name, typeof raw === "string" ? raw : undefined, DEFAULT_STAGING_BYTES, 1),
};

const FLAGS = {
  host: required("H", "this host's name in the topology, or its global index", "the name (or global index) of the host this daemon runs on"),
  topology: str("FILE", "the topology that names the hosts (a topology file or Slurm's topology.conf); default: the site configuration's (docs/slurm.md)"),
  connect: checked("ADDR", `the controller's ZeroMQ address (default: the site configuration's "controller", then tcp://127.0.0.1:5555)`, (address) =>
    addressFlag("--connect", address, "connect"),
  ),
  credentials: str(
    "FILE",
    `this host's daemon credential (daemon-H.json from \`monkeytree keys\`), required when the controller has a keyring; default $${CREDENTIALS_ENV}`,
  ),
  "staging-bytes": STAGING_BYTES_FLAG,
  listen: str(
    "HOST:PORT",
    "this host's cluster address, where the transfer engine listens (port 0: any free one); required unless the controller is on " +
      `this machine, when it defaults to ${DEFAULT_LISTEN}. 0.0.0.0 binds every interface (with a warning)`,
  ),
  replacement: list(
    "NAME=COMMAND",
    "a shell command that starts replacements of jobs naming NAME (their `monkeytree launch --replacement NAME`); repeat for more " +
      "names. NAME is 1-64 of a-z 0-9 . _ -. It runs with PATH, LANG, LC_ALL, TZ, HOME, USER, LOGNAME and the migration's " +
      "MONKEYTREE_CONTROLLER, _HOST, _JOB, _GROUP, _TP, _PP, _DP, _MIGRATION, _TOKEN and the checkpoint's _STAGING_BUFFER, " +
      "_STAGING_OFFSET, _STAGING_LENGTH; nothing else of the daemon's environment. A move of a job naming none of them rolls back",
  ),
  "run-as": str(
    "USER",
    "the unprivileged user that replacements of jobs without a user of their own run as, shared by all of them: leave it out where " +
      "tenants share hosts. A daemon running as root starts such jobs' replacements only with it (it starts none as root); " +
      "without root, replacements run as the daemon's user",
  ),
  cgroup: str(
    "DIR",
    "the cgroup v2 directory under which each replacement gets a cgroup of its own (default: this daemon's own cgroup, when it may " +
      'write there; "none" to do without, when what a replacement leaves running outside its process group outlives it)',
  ),
  "vouch-socket": str(
    "PATH",
    "a local socket where this host's launchers ask the daemon to vouch that they run here, which a controller with " +
      "--require-vouch needs before it takes their workers; `monkeytree launch` looks at " +
      `${defaultDaemonSocket(0).replace("-0.sock", "-H.sock")} unless told otherwise (default: no socket)`,
  ),
  heartbeat: seconds("S", "heartbeat interval in seconds; keep it well below the controller's --heartbeat-timeout", {
    default: DEFAULT_HEARTBEAT_MS / 1000,
    min: 0.01,
  }),
  ...METRICS_FLAG,
};

const help = helpText({
  command: "monkeytree daemon",
  table: FLAGS,
  about: `Runs the per-host daemon until SIGINT or SIGTERM. At start it removes staging files left by
dead processes and opens the transfer listener; then it registers the host with the
controller and heartbeats. During a migration to this host it stages the checkpoint in a file
of its own, readable by the job's user alone, reports whether every byte arrived intact, and
starts the replacement: the --replacement command the job names, as the job's user (from its
Slurm job, or \`monkeytree keys --job J --user U\`), in a cgroup of its own that is stopped
whole when the replacement exits. Replacement commands are this host's configuration only; no
message can make it run another.`,
  after: `exit codes: 0 stopped by a signal, 2 bad usage or a registration the controller refused,
3 internal error.`,
});

function parseListen(raw: string): { host: string; port: number; advertise?: string } {
  const match = /^(.+):(\d+)$/.exec(raw);
  const port = Number(match?.[2]);
  if (!match?.[1] || !Number.isInteger(port) || port > 65535) throw new UsageError(`--listen must be HOST:PORT with a port in 0..65535, got "${raw}"`);
  const host = match[1].replace(/^\[(.*)\]$/, "$1");
  // Sources cannot dial a wildcard address; they are told the machine's name instead.
  return host === "0.0.0.0" || host === "::" ? { host, port, advertise: hostname() } : { host, port };
}

/** `--credentials`, which must be host `host`'s daemon's. */
function daemonCredential(path: string | undefined, host: number): ReturnType<typeof credentialFlag> {
  const credential = credentialFlag(path);
  if (credential && !(credential.credential.principal.role === "daemon" && credential.credential.principal.host === host)) {
    throw new UsageError(
      `${credential.path} is not host ${host}'s daemon credential; give --credentials the daemon-${host}.json that \`monkeytree keys --daemon ${host}\` wrote`,
    );
  }
  return credential;
}

/** `--replacement` and `--run-as`: the commands by name, and the shared user, checked. */
function replacementSettings(
  flags: readonly string[] | undefined,
  user: string | undefined,
): { replacements: ReadonlyMap<string, string>; runAs: Tenant | undefined } {
  try {
    const replacements = parseReplacements(flags ?? []);
    if (replacements.size) requireSetpriv();
    return { replacements, runAs: user === undefined ? undefined : resolveTenant(user) };
  } catch (error) {
    if (error instanceof ReplacementConfigError) throw new UsageError(error.message);
    throw error;
  }
}

/** Resolves with the signal that stops the daemon, or the controller's refusal of its host. */
function stopped(daemon: HostDaemon): Promise<unknown[] | Error> {
  const refused = daemon.ready().then(
    () => new Promise<never>(() => {}),
    (error: unknown) => error as Error,
  );
  return Promise.race([once(process, "SIGINT"), once(process, "SIGTERM"), refused]);
}

/**
 * `--vouch-socket`, when given. Never by default: daemons of one machine (a demo, a test run)
 * would otherwise answer each other's launchers.
 */
async function vouchSocket(path: string | undefined, daemon: HostDaemon, log: Logger): Promise<VouchSocket | undefined> {
  if (path === undefined) return undefined;
  const socket = await VouchSocket.open(path, (job) => daemon.vouch(job), log);
  log.info(() => `launchers on this host ask to be vouched for at ${socket.path}`);
  return socket;
}

/** `--cgroup`: the directory given, "none", or by default this process's own cgroup v2 where it may write. */
function replacementCgroups(flag: string | undefined): ReplacementCgroups | undefined {
  if (flag === "none") return undefined;
  const parent = flag ?? ownCgroup();
  if (parent === null) return undefined;
  try {
    return ReplacementCgroups.open(parent);
  } catch (error) {
    if (error instanceof CgroupConfigError && flag !== undefined) throw new UsageError(error.message);
    if (error instanceof CgroupConfigError) return undefined;
    throw error;
  }
}

type DaemonFlags = FlagValues<typeof FLAGS>;

/** Which host this is, where the controller is, where transfers arrive and with which credential: the flags', else the site configuration's and the defaults. */
async function hostSettings(
  flags: DaemonFlags,
): Promise<Pick<DaemonOptions, "host" | "controller" | "stagingBytes" | "listen" | "heartbeatMs"> & { credential: ReturnType<typeof credentialFlag> }> {
  const config = await loadConfig();
  const host = hostFlag(flags.host, await loadTopology({ topology: flags.topology }, config, true));
  const controller = flags.connect ?? config.controller ?? "tcp://127.0.0.1:5555";
  if (flags.listen === undefined && !isLoopback(controller)) {
    throw new UsageError("--listen is required with a controller on another machine: give this host's cluster address, e.g. --listen 10.0.0.13:0");
  }
  const listen = parseListen(flags.listen ?? DEFAULT_LISTEN);
  return {
    host,
    controller,
    stagingBytes: flags["staging-bytes"],
    listen,
    heartbeatMs: flags.heartbeat,
    credential: daemonCredential(flags.credentials, host),
  };
}

/** Starts the daemon. Failing, it closes `options.cgroups`; an address it cannot listen on (`listenFlag`, as given) is bad input. */
function startDaemon(options: DaemonOptions, listenFlag: string): HostDaemon {
  try {
    return HostDaemon.start(options);
  } catch (error) {
    options.cgroups?.close();
    if (!(error instanceof DaemonStartError)) throw error;
    throw new InvalidInputError(`--listen ${listenFlag}`, [
      { path: "", message: `${error.message}; give --listen an address of this host, with a free port or 0` },
    ]);
  }
}

/** A started daemon with what the command opened for it, all closed together when it stops. */
interface Running {
  readonly daemon: HostDaemon;
  readonly cgroups: ReplacementCgroups | undefined;
  readonly vouching?: VouchSocket | undefined;
  readonly scrape?: MetricsServer | null;
}

async function shutdown({ daemon, cgroups, vouching, scrape }: Running): Promise<void> {
  await scrape?.close();
  await vouching?.close();
  await daemon.close();
  cgroups?.close();
}

/** Opens the vouch socket and the scrape endpoint, where asked; one that cannot open stops the daemon. */
async function openEndpoints(running: Running, vouchPath: string | undefined, scrape: () => Promise<MetricsServer | null>, logger: Logger): Promise<Running> {
  let vouching;
  try {
    vouching = await vouchSocket(vouchPath, running.daemon, logger);
    return { ...running, vouching, scrape: await scrape() };
  } catch (error) {
    await shutdown({ ...running, vouching });
    if (error instanceof VouchSocketError) throw new UsageError(error.message);
    throw error;
  }
}

/** The exit code: 0 for a signal; 2 for the controller's refusal of this host, after saying what to do about it. */
function exitCodeOf(stop: unknown[] | Error, host: number, credentialPath: string | undefined, logger: Logger, io: Io): ExitCode {
  if (stop instanceof Error) {
    const why =
      stop instanceof ControllerRefusedError
        ? refusalAdvice(stop, credentialPath, `the daemon-${host}.json that \`monkeytree keys --daemon ${host}\` wrote`)
        : stop.message;
    io.err.write(`monkeytree daemon: ${why}\n`);
    return ExitCode.usage;
  }
  logger.info(() => `stopping on ${String(stop[0] ?? "signal")}`);
  return ExitCode.ok;
}

export const command: Command = {
  summary: "run the per-host daemon (staging buffer, transfers, replacement launches)",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const { credential, ...settings } = await hostSettings(flags);
    const { host, controller, stagingBytes, listen } = settings;
    // The replacement launchers this daemon starts inherit its environment; they must never
    // find the daemon's credential there.
    delete process.env[CREDENTIALS_ENV];
    const { replacements, runAs } = replacementSettings(flags.replacement, flags["run-as"]);
    const cgroups = replacementCgroups(flags.cgroup);
    const logger = createLogger(`daemon ${host}`, (line) => io.err.write(`${line}\n`));
    if (listen.advertise !== undefined)
      logger.warn(() => `the transfer listener binds every interface (${listen.host}); give --listen this host's cluster address to bind only that`);
    const metrics = flags.metrics === undefined ? undefined : new DaemonMetrics();
    const daemon = startDaemon(
      {
        ...settings,
        log: logger,
        ...(credential ? { credential: credential.credential } : {}),
        replacements,
        ...(runAs === undefined ? {} : { runAs }),
        ...(cgroups ? { cgroups } : {}),
        ...(metrics ? { metrics } : {}),
      },
      flags.listen ?? DEFAULT_LISTEN,
    );
    const starts = replacements.size === 0 ? "no replacements" : `replacements ${[...replacements.keys()].join(", ")}${runAs ? ` as ${runAs.user}` : ""}`;
    io.out.write(`daemon for host ${host}: ${stagingBytes} staging bytes, transfers on ${daemon.endpoint}, controller ${controller}, ${starts}\n`);
    const scrape = async () => (metrics && flags.metrics ? await serveMetrics(flags.metrics, metrics.registry, logger, io) : null);
    const running = await openEndpoints({ daemon, cgroups }, flags["vouch-socket"], scrape, logger);
    const stop = await stopped(daemon);
    await shutdown(running);
    return exitCodeOf(stop, host, credential?.path, logger, io);
  },
};
