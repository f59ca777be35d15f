import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { chownSync } from "node:fs";
import { userInfo } from "node:os";
import {
  ClientClosedError,
  ControllerConnection,
  ControllerError,
  type ControllerRefusedError,
  type ConnectionOptions,
  type RequestBody,
} from "../../sdk/client/connection.ts";
import type { Logger } from "../../sdk/contract/log.ts";
import { Listener, removeStaleStagingBuffers, StagingBuffer, TransferError, type Grant } from "../../native/index.ts";
import type { Command, CommandReply, PrepareCommand, RefusalCode, SpawnCommand } from "../../sdk/contract/protocol/commands.ts";
import { safeDecodeCommand, safeDecodeReply } from "../../sdk/contract/protocol/codec.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { formatTransferEndpoint } from "../../sdk/contract/protocol/endpoint.ts";
import { replacementEnvironment } from "../../sdk/contract/protocol/replacement.ts";
import type { DaemonMetrics } from "./metrics.ts";
import type { ReplacementCgroups } from "./cgroup.ts";
import { baseEnvironment, launchArgv, ReplacementConfigError, resolveTenant, type Tenant } from "./replacements.ts";

/**
 * The per-host daemon: owns the host's migration staging buffer and transfer listener,
 * registers the host with the controller and heartbeats, grants ranges of the buffer to
 * incoming checkpoints, reports each transfer's verdict, and starts replacement launchers.
 * It speaks to the controller over one DEALER: its own requests (answered `ack`/`error`) and
 * the controller's commands (answered `daemon.prepared`/`daemon.done`/`daemon.refused`) share it.
 */

export interface DaemonOptions extends Pick<ConnectionOptions, "credential" | "retryMs"> {
  /** This host's global index. */
  readonly host: number;
  /** The controller's address, e.g. `tcp://10.0.0.1:5555`. */
  readonly controller: string;
  /**
   * The most checkpoint bytes staged at once. Each grant gets a /dev/shm file of its own,
   * created at prepare and owned by the job's user alone, so no tenant can map another's.
   */
  readonly stagingBytes: number;
  /** Where the transfer engine listens; port 0 picks a free one. `advertise` is the name sources dial. */
  readonly listen: { readonly host: string; readonly port: number; readonly advertise?: string };
  /**
   * The commands replacements start with, by the name a job gives in `worker.register`'s
   * `replacement` (`--replacement NAME=COMMAND`); each runs through /bin/sh.
   */
  readonly replacements?: ReadonlyMap<string, string>;
  /**
   * The unprivileged user replacements of jobs without a user of their own run as (`--run-as`),
   * shared by all of them; a daemon running as root starts those jobs' replacements only with one.
   */
  readonly runAs?: Tenant;
  /** Where each replacement gets a cgroup of its own, stopped whole when its launcher exits (`--cgroup`). */
  readonly cgroups?: ReplacementCgroups;
  readonly heartbeatMs?: number;
  /**
   * How long a vouch waits for this daemon to be the host's registered one before it refuses,
   * so that a local request never waits on it for ever (`DEFAULT_VOUCH_WAIT_MS`).
   */
  readonly vouchWaitMs?: number;
  readonly log?: Logger;
  /** Counts transfers and replacements, and reads the staging buffer's use, for `--metrics`. */
  readonly metrics?: DaemonMetrics;
}

/** What `HostDaemon.start` could not take: the listener's address. */
export class DaemonStartError extends Error {
  override readonly name = "DaemonStartError";
  constructor(
    /** The option that named it. */
    readonly option: "listen",
    message: string,
  ) {
    super(message);
  }
}

export const DEFAULT_HEARTBEAT_MS = 2_000;
/** Under the vouch socket's 5-s bound on a connection, so that the launcher hears why. */
export const DEFAULT_VOUCH_WAIT_MS = 4_000;
/**
 * One grant's life: `receiving` until the transfer settles, then `verified` (kept for the
 * replacement until its launcher exits) or `failed` (freed at once).
 */
interface Staged {
  readonly migration: string;
  /** The grant's own file, owned by the job's user; removed when the grant ends. */
  readonly buffer: StagingBuffer;
  readonly grant: Grant;
  /** Who the replacement runs as: the job's user, the `--run-as` user, or the daemon's own (undefined). */
  readonly tenant: Tenant | undefined;
  state: "receiving" | "verified" | "failed";
  /** The replacement launcher, once started (at prepare, or at the commit's spawn). */
  replacement: ChildProcess | null;
  /** The replacement's cgroup, when the daemon has `cgroups`: stopped whole once the launcher exits. */
  cgroup: string | null;
  /** Whether the controller asked for the replacement at the move's commit (`daemon.spawn`). */
  committed: boolean;
}

/** Who replaces the moved worker; whom as was settled at prepare. */
type ReplacementSpec = Omit<PrepareCommand["replacement"], "user">;
type Refusal = { readonly code: RefusalCode; readonly message: string };

/** Asks a replacement launcher and everything it started (its own process group) to stop. */
function stopGroup(child: ChildProcess | null): void {
  if (child?.pid === undefined || child.exitCode !== null) return;
  try {
    process.kill(-child.pid, "SIGTERM");
  } catch {
    // Already gone.
  }
}

/** The daemon's own user's name, for the jobs whose user it is. */
const OWN_USER = (() => {
  try {
    return userInfo().username;
  } catch {
    return null;
  }
})();

const silent: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

export class HostDaemon {
  private readonly connection: ControllerConnection;
  private readonly staged = new Map<string, Staged>();
  /** Staging files being allocated, by migration: their bytes count as reserved, and a repeated prepare waits for them. */
  private readonly allocating = new Map<string, { readonly bytes: number; readonly done: Promise<unknown> }>();
  private closed = false;
  private readonly heartbeat: NodeJS.Timeout;
  private readonly log: Logger;
  private registered: Promise<void>;
  private registering = false;
  /** Rejects if the controller refuses this connection's handshake: no registration can succeed then. */
  private readonly refusal: Promise<never>;
  /** This process's id to the controller: its own re-registrations are not a second daemon. */
  private readonly incarnation = randomBytes(16).toString("hex");

  private constructor(
    private readonly options: DaemonOptions,
    readonly listener: Listener,
  ) {
    this.log = options.log ?? silent;
    let refuse: (error: ControllerRefusedError) => void = () => {};
    this.refusal = new Promise<never>((_, reject) => (refuse = reject));
    // Requests are resent until answered: the controller may start after its daemons.
    this.connection = new ControllerConnection({
      endpoint: options.controller,
      timeoutMs: Infinity,
      log: this.log,
      onMessage: (frame) => this.receive(frame),
      onRefused: (error) => refuse(error),
      ...(options.credential === undefined ? {} : { credential: options.credential }),
      ...(options.retryMs === undefined ? {} : { retryMs: options.retryMs }),
    });
    options.metrics?.attach(() => ({ stagingBytes: options.stagingBytes, reservedBytes: this.reservedBytes() }));
    this.registered = this.register();
    this.heartbeat = setInterval(() => this.beat(), options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS);
  }

  /**
   * Clears staging files of dead processes, listens, and starts registering. An address it
   * cannot have is a `DaemonStartError`.
   */
  static start(options: DaemonOptions): HostDaemon {
    for (const path of removeStaleStagingBuffers()) options.log?.info(() => `removed stale staging buffer ${path}`);
    let listener: Listener;
    try {
      listener = Listener.open(options.listen);
    } catch (error) {
      if (error instanceof TransferError) throw new DaemonStartError("listen", error.message);
      throw error;
    }
    if (options.cgroups === undefined && options.replacements?.size) {
      options.log?.warn(
        () => "no cgroup for replacements: what a replacement leaves running outside its process group is not stopped with it; give --cgroup DIR (cgroup v2)",
      );
    }
    return new HostDaemon(options, listener);
  }

  /** Bytes granted to checkpoints staged or arriving now, or being allocated for one. */
  private reservedBytes(): number {
    const granted = [...this.staged.values()].reduce((sum, s) => sum + s.grant.ticket.length, 0);
    return [...this.allocating.values()].reduce((sum, a) => sum + a.bytes, granted);
  }

  /** The transfer engine's address, as grants announce it. */
  get endpoint(): string {
    return formatTransferEndpoint({
      host: this.options.listen.advertise ?? this.options.listen.host,
      port: this.listener.port,
      rdma: this.listener.rdmaUnavailable === null,
    });
  }

  /**
   * Resolves once the controller acknowledged this host's registration; rejects when it
   * refused it (a host index outside its topology, say), or refused the connection itself
   * (`ControllerRefusedError`: a credential missing, unexpected, or not in its keyring).
   */
  ready(): Promise<void> {
    return this.registered;
  }

  /**
   * Stops heartbeating and talking to the controller, fails outstanding grants and frees their
   * files. Replacements of committed moves keep running; those of moves not yet committed are
   * stopped, since their checkpoint goes with their file and the controller rolls the move back.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.heartbeat);
    for (const staged of this.staged.values()) if (!staged.committed) stopGroup(staged.replacement);
    this.listener.close();
    await Promise.allSettled([...this.staged.values()].map((s) => s.grant.completion));
    await this.connection.close();
    for (const staged of this.staged.values()) staged.buffer.free();
  }

  private register(): Promise<void> {
    this.registering = true;
    const body = {
      type: "daemon.register",
      host: this.options.host,
      incarnation: this.incarnation,
      stagingBytes: this.options.stagingBytes,
      endpoint: this.endpoint,
    } as const;
    const attempt = (): Promise<void> =>
      this.connection.request(body).then(
        () => {
          this.registering = false;
          this.log.info(
            () => `host ${this.options.host} registered with ${this.options.controller} (${this.options.stagingBytes} staging bytes at ${this.endpoint})`,
          );
        },
        async (error: unknown) => {
          // The host's previous daemon (this one before a restart, say) is still live to the
          // controller: wait for its heartbeats to lapse rather than give up.
          if (error instanceof ControllerError && error.code === "conflict" && !this.closed) {
            this.log.warn(() => `${error.message}; trying again`);
            await new Promise((resolve) => setTimeout(resolve, this.options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS));
            return attempt();
          }
          this.registering = false;
          throw error instanceof ControllerError ? new Error(`the controller refused host ${this.options.host}: ${error.message}`) : error;
        },
      );
    const registered = Promise.race([attempt(), this.refusal]);
    // `ready()` is where a refusal is reported, once; this keeps an unobserved one from crashing the process.
    registered.catch(() => {});
    return registered;
  }

  private beat(): void {
    // Until registered there is nothing to keep alive.
    if (this.registering) return;
    // Not resent: the next beat stands in for a lost one. Its answer comes to `receive`.
    this.connection.send({ type: "daemon.heartbeat", host: this.options.host, incarnation: this.incarnation });
  }

  /**
   * Tells the controller that a launcher of `job` runs on this host (it asked on the host's
   * local socket). Resolves once the controller took it; rejects with its refusal.
   */
  async vouch(job: string): Promise<void> {
    await this.registeredWithin(this.options.vouchWaitMs ?? DEFAULT_VOUCH_WAIT_MS);
    await this.connection.request({ type: "daemon.vouch", host: this.options.host, incarnation: this.incarnation, job });
    this.log.info(() => `vouched for a launcher of job ${job} on host ${this.options.host}`);
  }

  /** Waits for this daemon's registration, `ms` at most: rejects, saying so, past that. */
  private async registeredWithin(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the daemon on host ${this.options.host} has not registered with the controller within ${ms / 1000} s`)), ms);
    });
    try {
      await Promise.race([this.registered, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Sends a report until the controller answers it; a refusal is logged, and closing drops it. */
  private report(body: RequestBody): void {
    if (this.closed) return;
    this.connection.request(body).catch((error: unknown) => {
      if (error instanceof ControllerError) this.refused(body.type, error);
      else if (!(error instanceof ClientClosedError)) this.log.error(() => `${body.type}: ${(error as Error).message}`);
    });
  }

  private refused(request: string, error: Pick<ControllerError, "code" | "message">): void {
    this.log.warn(() => `the controller refused ${request}: ${error.message}`);
    // A restarted controller no longer knows this host: register it again.
    if (error.code === "unknown_worker" && !this.registering) {
      this.registered = this.register();
      // No caller waits on this one in `ready()`: its refusal is logged instead.
      this.registered.catch((refusal: unknown) => {
        if (!(refusal instanceof ClientClosedError)) this.log.error(() => (refusal as Error).message);
      });
    }
  }

  /** Frames from the controller that answer no waiting request: its commands, and heartbeats' answers. */
  private receive(frame: Buffer): void {
    const command = safeDecodeCommand(frame);
    if (command.success) {
      this.answer(this.carryOut(command.data));
      return;
    }
    if (command.error.code !== "unknown_type") {
      this.log.warn(() => `unreadable command: ${command.error.message}`);
      if (command.id !== null) this.answer(this.refuse(command.id, "malformed", command.error.message));
      return;
    }
    const decoded = safeDecodeReply(frame);
    if (!decoded.success) this.log.warn(() => `unreadable answer from the controller: ${decoded.error.message}`);
    else if (decoded.data.type === "error") this.refused(`request #${decoded.data.id}`, decoded.data);
  }

  private answer(reply: CommandReply | Promise<CommandReply>): void {
    void Promise.resolve(reply).then((r) => this.connection.answer(r));
  }

  private carryOut(command: Command): CommandReply | Promise<CommandReply> {
    switch (command.type) {
      case "daemon.prepare":
        return this.prepare(command);
      case "daemon.release": {
        const staged = this.staged.get(command.token);
        if (staged) {
          this.listener.revoke(command.token);
          this.drop(command.token, staged);
          stopGroup(staged.replacement);
          this.log.info(() => `released the staging of migration ${staged.migration}`);
        }
        return this.done(command.id);
      }
      case "daemon.spawn":
        return this.spawn(command);
    }
  }

  private async prepare(command: PrepareCommand): Promise<CommandReply> {
    // The controller sends each prepare once; should one come twice, the checkpoint is not
    // staged twice nor a second replacement started for the one move.
    const allocating = this.allocating.get(command.migration);
    if (allocating) {
      await allocating.done;
      return this.prepare(command);
    }
    const staging = [...this.staged.values()].find((s) => s.migration === command.migration);
    if (staging) {
      if (staging.grant.ticket.length === command.bytes) return this.prepared(command.id, staging.grant);
      return this.refuse(
        command.id,
        "malformed",
        `migration ${command.migration} is already staging ${staging.grant.ticket.length} bytes on host ${this.options.host}, not ${command.bytes}`,
      );
    }
    // Refused before anything is staged, so the move rolls back; after its commit it could not.
    const starts = this.commandFor(command.replacement);
    if (typeof starts !== "string") return this.refuse(command.id, starts.code, starts.message);
    const tenant = this.tenantFor(command.replacement);
    if (tenant !== undefined && "code" in tenant) return this.refuse(command.id, tenant.code, tenant.message);
    const free = this.options.stagingBytes - this.reservedBytes();
    if (command.bytes > free) {
      return this.refuse(
        command.id,
        "no_space",
        `${command.bytes} bytes do not fit in host ${this.options.host}'s staging: ${free} of its ${this.options.stagingBytes} bytes are free; start the daemon with a larger --staging-bytes`,
      );
    }
    const done = this.stagingFile(command.bytes, tenant);
    this.allocating.set(command.migration, { bytes: command.bytes, done });
    const buffer = await done.finally(() => this.allocating.delete(command.migration));
    if ("code" in buffer) return this.refuse(command.id, buffer.code, buffer.message);
    if (this.closed) {
      buffer.free();
      return this.refuse(command.id, "no_space", `the daemon on host ${this.options.host} is stopping`);
    }
    return this.stage(command, buffer, tenant);
  }

  /** Grants `buffer` to the move's source and starts its replacement; the grant answers the prepare. */
  private stage(command: PrepareCommand, buffer: StagingBuffer, tenant: Tenant | undefined): CommandReply {
    const grant = this.listener.grant(buffer, { length: command.bytes });
    const staged: Staged = { migration: command.migration, buffer, grant, tenant, state: "receiving", replacement: null, cgroup: null, committed: false };
    const token = grant.ticket.token;
    this.staged.set(token, staged);
    grant.completion.then(
      (result) => {
        staged.state = "verified";
        this.options.metrics?.received(result);
        this.log.info(() => `migration ${command.migration}: received ${result.bytes} bytes in ${result.seconds.toFixed(3)} s`);
        // A transfer can end just after a `release` withdrew its grant: that move is already rolled back.
        if (this.staged.get(token) === staged)
          this.report({ type: "daemon.transfer-result", host: this.options.host, token, bytes: result.bytes, outcome: "verified" });
      },
      (error: unknown) => {
        staged.state = "failed";
        // A grant withdrawn by `release` belongs to a migration the controller already rolled back.
        if (this.staged.get(token) !== staged || this.closed) return;
        this.drop(token, staged);
        stopGroup(staged.replacement);
        const code = error instanceof TransferError ? error.code : "io";
        const detail = `${code}: ${(error as Error).message}`;
        this.options.metrics?.failed(code === "checksum_mismatch" ? "checksum-mismatch" : "failed");
        this.log.warn(() => `migration ${command.migration}: transfer failed (${detail})`);
        this.report({
          type: "daemon.transfer-result",
          host: this.options.host,
          token,
          bytes: 0,
          outcome: code === "checksum_mismatch" ? "checksum-mismatch" : "failed",
          detail,
        });
      },
    );
    this.log.info(() => `migration ${command.migration}: staging ${command.bytes} bytes in ${buffer.name}${tenant ? `, owned by ${tenant.user}` : ""}`);
    // Started now, the replacement's process start overlaps the transfer; the controller holds
    // its registration until the move commits. If it cannot start, the spawn at commit says why.
    void this.startReplacement(staged, command.replacement, token).then((failure) => {
      if (failure) this.log.warn(() => `migration ${command.migration}: ${failure.message}`);
    });
    return this.prepared(command.id, grant);
  }

  private prepared(id: number, grant: Grant): CommandReply {
    const endpoint = formatTransferEndpoint({ ...grant.ticket, rdma: grant.ticket.rdma === true });
    return { v: PROTOCOL_VERSION, type: "daemon.prepared", id, host: this.options.host, endpoint, token: grant.ticket.token };
  }

  private async spawn(command: SpawnCommand): Promise<CommandReply> {
    const staged = this.staged.get(command.token);
    if (!staged) return this.refuse(command.id, "unknown_token", `no staged checkpoint on host ${this.options.host} carries this token`);
    staged.committed = true;
    if (staged.replacement) return this.done(command.id);
    if (staged.state !== "verified")
      return this.refuse(command.id, "not_staged", `migration ${staged.migration}'s checkpoint is ${staged.state}, not verified`);
    const failure = await this.startReplacement(staged, command, command.token);
    return failure === null ? this.done(command.id) : this.refuse(command.id, failure.code, failure.message);
  }

  /**
   * Starts the replacement launcher, in a process group of its own so a rollback can stop it
   * with everything it started. Resolves with null once it runs, or why it could not start.
   */
  private startReplacement(staged: Staged, spec: ReplacementSpec, token: string): Promise<Refusal | null> {
    const command = this.commandFor(spec);
    if (typeof command !== "string") return Promise.resolve(command);
    const env = {
      ...baseEnvironment(staged.tenant),
      ...replacementEnvironment({
        MONKEYTREE_CONTROLLER: this.options.controller,
        MONKEYTREE_HOST: this.options.host,
        MONKEYTREE_JOB: spec.job,
        MONKEYTREE_GROUP: spec.group,
        MONKEYTREE_TP: spec.parallelism.tp,
        MONKEYTREE_PP: spec.parallelism.pp,
        MONKEYTREE_DP: spec.parallelism.dp,
        MONKEYTREE_NODE_RANK: spec.place.nodeRank,
        MONKEYTREE_NODES: spec.place.nodes,
        MONKEYTREE_MIGRATION: staged.migration,
        MONKEYTREE_TOKEN: token,
        MONKEYTREE_STAGING_BUFFER: staged.buffer.name,
        MONKEYTREE_STAGING_OFFSET: 0,
        MONKEYTREE_STAGING_LENGTH: staged.grant.ticket.length,
      }),
    };
    try {
      staged.cgroup = this.options.cgroups?.create() ?? null;
    } catch (error) {
      return Promise.resolve({ code: "launch_failed", message: `could not make the replacement's cgroup: ${(error as Error).message}` });
    }
    // Only root switches users; a daemon running as its tenant starts replacements as itself.
    const user = process.getuid?.() === 0 ? staged.tenant : undefined;
    const [file, ...args] = launchArgv(command, {
      ...(user ? { tenant: user } : {}),
      ...(staged.cgroup ? { cgroupProcs: join(staged.cgroup, "cgroup.procs") } : {}),
    });
    const child = spawn(file!, args, { env, stdio: ["ignore", "inherit", "inherit"], detached: true });
    // A stopped daemon exits while the replacements of committed moves train on.
    child.unref();
    staged.replacement = child;
    child.once("exit", (code, signal) => {
      const how = signal ?? `code ${code}`;
      // Whatever the launcher left running goes with it, however far it strayed from its group.
      if (staged.cgroup) void this.options.cgroups?.stop(staged.cgroup);
      const current = this.staged.get(token) === staged && staged.replacement === child;
      // The controller decides what the exit means for the move; one this daemon stopped (a
      // release, a failed transfer) belongs to a move the controller already gave up.
      if (current) this.report({ type: "daemon.replacement-exited", host: this.options.host, migration: staged.migration, token, code, signal });
      if (current && staged.state === "receiving") {
        // Its checkpoint is still on its way: the range stays reserved until the transfer settles
        // or the controller releases it (never free while a sender may still write into it).
        staged.replacement = null;
        this.log.warn(() => `migration ${staged.migration}: replacement launcher exited (${how}) before its checkpoint arrived; its staging stays reserved`);
        return;
      }
      // The checkpoint stays staged until the launcher that loads it has exited.
      if (current) this.drop(token, staged);
      this.log.info(() => `migration ${staged.migration}: replacement launcher exited (${how}); its staging is free`);
    });
    return new Promise((resolve) => {
      child.once("spawn", () => {
        this.options.metrics?.replacementStarted();
        this.log.info(() => `migration ${staged.migration}: started the replacement launcher (pid ${child.pid ?? "?"})`);
        resolve(null);
      });
      child.once("error", (error) => {
        staged.replacement = null;
        resolve({ code: "launch_failed", message: `could not start the replacement launcher: ${error.message}` });
      });
    });
  }

  /** The configured command that starts `spec`'s replacement, or why this daemon starts none. */
  private commandFor(spec: ReplacementSpec): string | Refusal {
    const command = spec.replacement === null ? undefined : this.options.replacements?.get(spec.replacement);
    if (command === undefined) {
      const message =
        spec.replacement === null
          ? `job ${spec.job} named no replacement command; start its launchers with --replacement NAME and the daemon on host ${this.options.host} with --replacement NAME=COMMAND`
          : `the daemon on host ${this.options.host} has no replacement "${spec.replacement}" (job ${spec.job} names it); start the daemon with --replacement ${spec.replacement}=COMMAND`;
      return { code: "unknown_replacement", message };
    }
    return command;
  }

  /**
   * Who `spec`'s replacement runs as: the job's own user; without one, the `--run-as` user, or
   * the daemon's own when it is not root. Or why this host starts none for the job.
   */
  private tenantFor(spec: PrepareCommand["replacement"]): Tenant | undefined | Refusal {
    const root = process.getuid?.() === 0;
    if (spec.user === null) {
      if (this.options.runAs || !root) return this.options.runAs;
      const message = `job ${spec.job} has no user of its own and the daemon on host ${this.options.host} runs as root without --run-as, so it starts no replacement for it; give the job its user (\`monkeytree keys --job ${spec.job} --user USER\`, or its Slurm job's) or start the daemon with --run-as USER`;
      return { code: "run_as_required", message };
    }
    if (!root && spec.user === OWN_USER) return undefined;
    try {
      return resolveTenant(spec.user, `job ${spec.job}'s user ${spec.user} on host ${this.options.host}`);
    } catch (error) {
      if (error instanceof ReplacementConfigError) return { code: "unknown_user", message: error.message };
      throw error;
    }
  }

  /** A file of its own for one grant, readable and writable by `tenant` alone; or why there is no room. */
  private async stagingFile(bytes: number, tenant: Tenant | undefined): Promise<StagingBuffer | Refusal> {
    let buffer: StagingBuffer;
    try {
      // Unlocked: the pages are allocated now, and a grant's life is one move.
      buffer = await StagingBuffer.createAsync({ size: bytes, lock: false });
    } catch (error) {
      if (error instanceof TransferError) return { code: "no_space", message: `cannot stage ${bytes} bytes on host ${this.options.host}: ${error.message}` };
      throw error;
    }
    try {
      if (tenant && process.getuid?.() === 0) chownSync(buffer.path, tenant.uid, tenant.gid);
    } catch (error) {
      buffer.free();
      throw error;
    }
    return buffer;
  }

  /**
   * Forgets a grant and removes its file (a replacement that mapped it keeps its mapping). A
   * revoked grant's transfer may still be writing into the file for a moment; the grant settles
   * only once no transfer thread holds it, so the file goes then.
   */
  private drop(token: string, staged: Staged): void {
    this.staged.delete(token);
    const free = () => {
      try {
        staged.buffer.free();
      } catch (error) {
        this.log.error(() => `migration ${staged.migration}: could not free its staging: ${(error as Error).message}`);
      }
    };
    void staged.grant.completion.then(free, free);
  }

  private done(id: number): CommandReply {
    return { v: PROTOCOL_VERSION, type: "daemon.done", id, host: this.options.host };
  }

  private refuse(id: number, code: RefusalCode, message: string): CommandReply {
    this.log.warn(() => `refused command #${id}: ${message}`);
    return { v: PROTOCOL_VERSION, type: "daemon.refused", id, host: this.options.host, code, message };
  }
}
