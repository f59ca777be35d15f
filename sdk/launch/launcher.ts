import { spawn, type ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { crc32cLibraryPath, send, StagingBuffer } from "../../native/index.ts";
import { HostAgent } from "../agent.ts";
import { NO_STOP, type Answer } from "../hold.ts";
import { ControllerClient } from "../client.ts";
import type { ControllerRefusedError } from "../connection.ts";
import { askToVouch, VouchError } from "./vouch.ts";
import { ticketFor } from "../protocol/endpoint.ts";
import type { Logger } from "../log.ts";
import {
  CHANNEL_ENV, CHANNEL_VERSION, CRC32C_LIBRARY_ENV, EXPECTED_NODE_RANK_ENV, EXPECTED_NODES_ENV, INBOX_ENV, INBOX_OFFSET_ENV,
  OUTBOX_ENV, RESUMING_ENV, SHARE_ENV,
  type ChannelDirective, type ChannelReply, type ChannelRequest,
} from "../protocol/channel.ts";
import type { ReplacementEnv } from "../protocol/replacement.ts";
import type { Assignment, Directive, Parallelism, WorkerIdentity } from "../protocol/worker.ts";
import { ChannelServer } from "./channel-server.ts";
import type { TorchrunCommand } from "./torchrun.ts";
import type { Credential } from "../protocol/auth.ts";

/**
 * `monkeytree launch`'s agent, in the manner of torchrun's elastic agent. It registers this
 * host's worker, starts torchrun with a local channel, and answers its processes' barriers on
 * this host (`HostAgent`, whose stop-point state machine is `sdk/hold.ts`): `continue` without
 * a word to the controller, unless the job stops for a move; then the processes re-form their
 * process group (`reconfigure`), save into a staging buffer that the launcher sends to the
 * destination (`migrate-out`), or exit (`stop`).
 *
 *   registering → starting (torchrun starts while the registration waits) → running → exited
 */

export type LauncherState = "registering" | "starting" | "running" | "exited";

export interface LauncherOptions {
  readonly controller: string;
  /** The job's credential, when the controller has a keyring. */
  readonly credential?: Credential;
  /** Without word from the controller this long, a stop not yet sealed is let go of (`DEFAULT_HOLD_TIMEOUT_MS`). */
  readonly holdTimeoutMs?: number;
  readonly worker: WorkerIdentity;
  readonly parallelism: Parallelism;
  /** Staging this host's checkpoint needs: every local process's share, page-aligned. */
  readonly checkpointBytes: number;
  /** The job's process group of generation g meets at `masterPortBase + g`. */
  readonly masterPortBase: number;
  readonly torchrun: TorchrunCommand;
  /** Which of a destination daemon's --replacement commands starts this job's replacements. */
  readonly replacementName?: string;
  /** Set when a daemon started this launcher to replace a migrated worker. */
  readonly replacement: ReplacementEnv | null;
  /**
   * The host daemon's local socket: a fresh worker first asks its daemon to vouch that it runs
   * here, which a controller with `--require-vouch` needs (a replacement's token proves it).
   */
  readonly daemonSocket?: string;
  readonly log: Logger;
}

/** A problem the user can fix (a master host without a daemon, a checkpoint too large). */
export class LaunchError extends Error {
  override readonly name = "LaunchError";
}

const PAGE = 4096;
/** A progress line at the first barrier, then every this many steps. */
const PROGRESS_EVERY = 50;

export class Launcher {
  private state: LauncherState = "registering";
  private assignment: Assignment | null = null;
  /** Where the local processes save their checkpoints at a migration (`--checkpoint-bytes`). */
  private outbox: StagingBuffer | null = null;
  /** The control block: the stop word, then one word per local process (sdk/protocol/channel.ts). */
  private control: StagingBuffer | null = null;
  /** Set before torchrun starts, so every attach finds it. */
  private registration: Promise<Assignment> | null = null;
  private client: ControllerClient | null = null;
  private agent: HostAgent | null = null;
  private child: ChildProcess | null = null;
  private stopped = false;
  /** The furthest barrier logged, and when the processes were last told to re-form; null once they trained on. */
  private logged = -1;
  private reformedAt: number | null = null;
  /** While this host is a move's source: when its processes were told to save, and the bytes they wrote. */
  private saving: { asked: number; written: number } | null = null;
  /** The local ranks that reached attach; `attached` settles once all have. */
  private readonly attaching = new Set<number>();
  private allAttached: () => void = () => {};
  private readonly attached = new Promise<void>((resolve) => (this.allAttached = resolve));

  constructor(private readonly options: LauncherOptions) {}

  /** Each local process's share of the checkpoint staging. */
  get share(): number {
    return Math.floor(this.options.checkpointBytes / this.options.torchrun.nprocPerNode / PAGE) * PAGE;
  }

  /**
   * Asks the host's daemon to vouch for this launcher. Never fails the launch: where no daemon
   * vouches, a controller that needs it refuses the registration, saying why.
   */
  private async vouched(): Promise<void> {
    const { daemonSocket, worker, log } = this.options;
    if (daemonSocket === undefined) return;
    try {
      await askToVouch(daemonSocket, worker.job);
      log.info(() => `host ${worker.host}'s daemon vouched for this launcher`);
    } catch (error) {
      if (!(error instanceof VouchError)) throw error;
      if (error.absent) log.info(() => `${error.message}: registering without its vouch`);
      else log.warn(() => `host ${worker.host}'s daemon did not vouch for this launcher (${error.message}); registering without it`);
    }
  }

  /**
   * Runs until torchrun exits; resolves with the exit code to use. Rejects with
   * `ControllerRefusedError` as soon as the controller refuses the connection's handshake (a
   * credential missing, unexpected, or not in its keyring), which no waiting would change.
   */
  async run(): Promise<number> {
    const { options } = this;
    if (this.share === 0) throw new LaunchError(`--checkpoint-bytes ${options.checkpointBytes} leaves less than a page for each of ${options.torchrun.nprocPerNode} processes`);
    // ZeroMQ answers a refused handshake with no reply at all: without this, the registration
    // would wait for its deadline.
    let refuse: (error: ControllerRefusedError) => void = () => {};
    const refused = new Promise<never>((_, reject) => (refuse = reject));
    // The registration below reports it; this keeps one before the registration starts handled.
    refused.catch(() => undefined);
    this.client = new ControllerClient({
      endpoint: options.controller,
      ...(options.credential === undefined ? {} : { credential: options.credential }),
      onRefused: (error) => refuse(error),
    });
    const channel = await ChannelServer.open(
      join(tmpdir(), `monkeytree-launch-${process.pid}.sock`),
      (request) => this.handle(request),
      (phase) => options.log.info(() => `local rank ${phase.localRank}: ${phase.name} took ${(phase.seconds * 1000).toFixed(0)} ms`),
      options.log,
    );
    const control = StagingBuffer.create({ size: PAGE, lock: false });
    this.control = control;
    control.storeWord(0, NO_STOP);
    for (let rank = 0; rank < options.torchrun.nprocPerNode; rank++) control.storeWord(1 + rank, -1);
    try {
      this.agent = new HostAgent(this.client, options.worker, options.parallelism, {
        ranks: options.torchrun.nprocPerNode,
        checkpointBytes: options.checkpointBytes,
        ...(options.replacementName === undefined ? {} : { replacement: options.replacementName }),
        ...(options.replacement ? { token: options.replacement.MONKEYTREE_TOKEN } : {}),
        ...(options.holdTimeoutMs === undefined ? {} : { holdTimeoutMs: options.holdTimeoutMs }),
        log: options.log,
        onSend: (directive) => void this.sendCheckpoint(directive),
        onStep: (step) => this.progress(step),
        control: {
          publish: (word) => control.storeWord(0, word),
          passed: () => {
            let passed = -1;
            for (let rank = 0; rank < options.torchrun.nprocPerNode; rank++) passed = Math.max(passed, control.loadWord(1 + rank));
            return passed;
          },
        },
      });
      // Allocated (and its pages faulted in) once, before training: at a migration it is ready.
      // Before the registration too: a replacement's first step waits for none of it.
      this.outbox = StagingBuffer.create({ size: options.checkpointBytes, lock: false });
      // A replacement registers once every local process waits at attach: its registration
      // tells the controller it is ready, and the job pauses for the move only then.
      const agent = this.agent;
      const ready = options.replacement ? this.attached : this.vouched();
      // The assignment is taken as it arrives: the processes' attach replies, chained on the
      // registration too, read it.
      this.registration = Promise.race([ready.then(() => agent.register()), refused]).then((assignment) => (this.assignment = assignment));
      // Observed here so a refusal during torchrun's start is not an unhandled rejection.
      this.registration.catch(() => undefined);
      // torchrun starts while the registration waits (for the job's other workers, or for a
      // replacement's move to commit): Python and the script load meanwhile, and the processes'
      // attach is answered once the assignment is here.
      const { exited } = await this.startTorchrun(channel.path);
      let assignment: Assignment;
      try {
        const died = exited.then((code) => Promise.reject(new LaunchError(`torchrun exited with ${code} before the job took this host's worker`)));
        died.catch(() => undefined);
        assignment = await Promise.race([this.registration, died]);
        this.groupOf(0);
      } catch (error) {
        this.terminate("SIGTERM");
        await exited;
        throw error;
      }
      this.enter("running", `node rank ${assignment.nodeRank} of ${assignment.nodes}, generation ${assignment.generation}`);
      const code = await exited;
      if (code === 0 && !this.stopped) {
        await this.finish();
        this.enter("exited", "training ended; the job is finished");
      } else {
        this.enter("exited", this.stopped ? "stopped" : `torchrun failed with ${code}`);
      }
      return code;
    } finally {
      this.agent?.close();
      this.outbox?.free();
      control.free();
      await channel.close();
      await this.client.close();
    }
  }

  /** Stops torchrun (on SIGINT or SIGTERM to the launcher). */
  terminate(signal: NodeJS.Signals): void {
    this.child?.kill(signal);
  }

  private enter(state: LauncherState, why: string): void {
    this.options.log.info(() => `${this.state} → ${state}: ${why}`);
    this.state = state;
  }

  /** Tells the controller the job ended; a controller that is down is waited for only so long. */
  private async finish(): Promise<void> {
    try {
      await this.client!.finish(this.options.worker.job);
    } catch (error) {
      this.options.log.warn(() => `the controller did not hear that job ${this.options.worker.job} finished (${(error as Error).message}); it ends the job once its workers are lost`);
    }
  }

  /** Starts torchrun; resolves once it runs (or failed to), with a promise of its exit code. */
  private async startTorchrun(channel: string): Promise<{ exited: Promise<number> }> {
    const [program, ...args] = this.options.torchrun.local;
    const ranges = { [OUTBOX_ENV]: this.outbox!.name, [SHARE_ENV]: String(this.share) };
    const env = { ...process.env, [CHANNEL_ENV]: channel, [CRC32C_LIBRARY_ENV]: crc32cLibraryPath, ...ranges, ...this.resumingEnv() };
    const child = spawn(program!, args, { stdio: ["ignore", "inherit", "inherit"], env });
    this.child = child;
    let started: () => void;
    const spawned = new Promise<void>((resolve) => (started = resolve));
    const exited = new Promise<number>((resolve) => {
      child.once("spawn", () => {
        this.enter("starting", `torchrun started (pid ${child.pid ?? "?"}) with ${this.options.torchrun.nprocPerNode} local processes; registering`);
        started();
      });
      child.once("error", (error) => {
        started();
        this.options.log.error(() => `could not start ${program}: ${error.message}`);
        resolve(127);
      });
      child.once("exit", (code, signal) => resolve(code ?? (signal ? 128 + 15 : 1)));
    });
    await spawned;
    return { exited };
  }

  /** What the processes know before attach of the state they will load, if any (`RESUMING_ENV`). */
  private resumingEnv(): Record<string, string> {
    const r = this.options.replacement;
    if (!r) return { [RESUMING_ENV]: "0" };
    return {
      [RESUMING_ENV]: "1",
      [EXPECTED_NODE_RANK_ENV]: String(r.MONKEYTREE_NODE_RANK),
      [EXPECTED_NODES_ENV]: String(r.MONKEYTREE_NODES),
      [INBOX_ENV]: r.MONKEYTREE_STAGING_BUFFER,
      [INBOX_OFFSET_ENV]: String(r.MONKEYTREE_STAGING_OFFSET),
    };
  }

  /** The process-group values of one local rank under the current assignment. */
  private groupOf(localRank: number) {
    const a = this.assignment!;
    if (a.masterAddress === null) {
      throw new LaunchError(`the job's master, host ${a.masterHost}, runs no monkeytree daemon, so its address is unknown; start \`monkeytree daemon --host ${a.masterHost}\` there`);
    }
    const n = this.options.torchrun.nprocPerNode;
    return {
      rank: a.nodeRank * n + localRank,
      worldSize: a.nodes * n,
      masterAddr: a.masterAddress,
      masterPort: this.options.masterPortBase + (a.generation % 1000),
      generation: a.generation,
    };
  }

  private handle(request: Exclude<ChannelRequest, { type: "phase" }>): Promise<ChannelReply> {
    const n = this.options.torchrun.nprocPerNode;
    if (request.localRank >= n) return Promise.resolve(error(`localRank ${request.localRank} is not below --nproc-per-node ${n}`));
    switch (request.type) {
      case "attach":
        this.attaching.add(request.localRank);
        if (this.attaching.size === n) this.allAttached();
        return this.registration!.then(() => this.attachReply(request.localRank));
      case "barrier":
        return this.agent!.arrive(request.localRank, request.step).then((answer) => this.reply(answer, request.localRank));
      case "saved":
        if (request.bytes > this.share) return Promise.resolve(error(`local rank ${request.localRank} saved ${request.bytes} bytes into a ${this.share}-byte range`));
        if (this.saving) this.saving.written += request.bytes;
        return this.agent!.saved(request.localRank).then((answer) => this.reply(answer, request.localRank));
    }
  }

  /** The group values a local process forms its group with, and for a replacement where its checkpoint is. */
  private attachReply(localRank: number): ChannelReply {
    const r = this.options.replacement;
    const resume = r && {
      buffer: r.MONKEYTREE_STAGING_BUFFER,
      offset: r.MONKEYTREE_STAGING_OFFSET + localRank * this.share,
      length: this.share,
      step: this.assignment!.resumeStep ?? 0,
    };
    const control = { buffer: this.control!.name, stopOffset: 0, slotOffset: 8 * (1 + localRank) };
    return { v: CHANNEL_VERSION, type: "attached", ...this.groupOf(localRank), localRank, resume, control };
  }

  /**
   * A line per step seen (at debug level but the first and every so many), and when training
   * resumes after a re-formation. Barriers passed in the control block are seen at each tick.
   */
  private progress(step: number): void {
    if (step <= this.logged) return;
    const every = Math.floor(step / PROGRESS_EVERY) > Math.floor(this.logged / PROGRESS_EVERY);
    (this.logged < 0 || every ? this.options.log.info : this.options.log.debug)(() => `barrier ${step} reached`);
    if (this.reformedAt !== null) {
      const seconds = (performance.now() - this.reformedAt) / 1000;
      this.options.log.info(() => `training resumed: barrier ${step} reached ${seconds.toFixed(3)} s after the group was told to re-form`);
      this.reformedAt = null;
    }
    this.logged = step;
  }

  private reply(answer: Answer, localRank: number): ChannelReply {
    if (answer.kind === "error") return error(answer.message);
    if (answer.kind === "reconfigure") {
      this.assignment = answer.assignment;
      this.reformedAt = performance.now();
    }
    if (answer.kind === "stop") this.stopped = true;
    if (answer.kind === "migrate-out" && this.saving === null) this.saving = { asked: performance.now(), written: 0 };
    return { v: CHANNEL_VERSION, type: "directive", directive: this.translate(answer, localRank) };
  }

  private translate(directive: Directive, localRank: number): ChannelDirective {
    switch (directive.kind) {
      case "continue":
        return { kind: "continue" };
      case "stop":
        return { kind: "stop", reason: directive.reason };
      case "reconfigure":
        return { kind: "reconfigure", ...this.groupOf(localRank) };
      case "migrate-out":
        return { kind: "migrate-out", buffer: this.outbox!.name, offset: localRank * this.share, length: this.share };
    }
  }

  /** Every local process saved: the host's checkpoint goes to the destination. */
  private async sendCheckpoint(directive: Extract<Directive, { kind: "migrate-out" }>): Promise<void> {
    const saving = this.saving;
    this.saving = null;
    const after = saving ? `, ${((performance.now() - saving.asked) / 1000).toFixed(3)} s after migrate-out` : "";
    this.options.log.info(() => `migration ${directive.migration}: sending ${this.options.checkpointBytes} bytes to ${directive.endpoint}; every local process saved, ${saving?.written ?? 0} bytes in all${after}`);
    const started = performance.now();
    try {
      const result = await send({ ticket: ticketFor(directive.endpoint, directive.token, this.options.checkpointBytes), buffer: this.outbox! });
      this.options.log.info(() => `migration ${directive.migration}: sent ${result.bytes} bytes in ${((performance.now() - started) / 1000).toFixed(3)} s over ${result.transport}`);
    } catch (failure) {
      // The destination reports the failure (or goes silent); the controller rolls back.
      this.options.log.warn(() => `migration ${directive.migration}: the checkpoint did not reach host ${directive.to}: ${(failure as Error).message}`);
    } finally {
      this.agent!.sent();
    }
  }
}

const error = (message: string): ChannelReply => ({ v: CHANNEL_VERSION, type: "error", message });
