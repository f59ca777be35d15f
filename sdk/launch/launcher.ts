import { spawn, type ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { crc32cLibraryPath, send, StagingBuffer } from "../../native/index.ts";
import { ControllerClient, WorkerClient } from "../client.ts";
import type { ControllerRefusedError } from "../connection.ts";
import { ticketFor } from "../protocol/endpoint.ts";
import type { Logger } from "../log.ts";
import { CHANNEL_ENV, CHANNEL_VERSION, CRC32C_LIBRARY_ENV, type ChannelDirective, type ChannelReply, type ChannelRequest } from "../protocol/channel.ts";
import type { ReplacementEnv } from "../protocol/replacement.ts";
import type { Assignment, Directive, Parallelism, WorkerIdentity } from "../protocol/worker.ts";
import { ChannelServer } from "./channel-server.ts";
import { startHeartbeat } from "./heartbeat.ts";
import { unusedPort } from "./ports.ts";
import type { TorchrunCommand } from "./torchrun.ts";
import type { Credential } from "../protocol/auth.ts";

/**
 * `monkeytree launch`'s agent, an explicit state machine in the manner of torchrun's elastic
 * agent. It registers this host's worker, starts torchrun with a local channel, meets the
 * controller once per step when every local process has reached the barrier, and acts on the
 * answer: the processes re-form their process group (`reconfigure`), save into a staging
 * buffer that the agent sends to the destination (`migrate-out`), or exit (`stop`).
 *
 *   registering → starting (torchrun starts while the registration waits) → running
 *   running ⇄ holding (a barrier at the controller)
 *                                     → saving → sending → holding
 *   running/holding → stopping (moved away or told to stop) → exited
 *   running → exited (training ended: the job is finished)
 */

export type LauncherState = "registering" | "starting" | "running" | "holding" | "saving" | "sending" | "stopping" | "exited";

export interface LauncherOptions {
  readonly controller: string;
  /** The job's credential, when the controller has a keyring. */
  readonly credential?: Credential;
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
  readonly log: Logger;
}

/** A problem the user can fix (a master host without a daemon, a checkpoint too large). */
export class LaunchError extends Error {
  override readonly name = "LaunchError";
}

const PAGE = 4096;
/** Recent step times kept, to tell a migration's cost from a step's. */
const STEP_HISTORY = 16;
/** A progress line at the first barrier, then every this many steps. */
const PROGRESS_EVERY = 50;
type Waiter = (reply: ChannelReply) => void;

export class Launcher {
  private state: LauncherState = "registering";
  private assignment: Assignment | null = null;
  /** Where the local processes save their checkpoints at a migration (`--checkpoint-bytes`). */
  private outbox: StagingBuffer | null = null;
  /** Set before torchrun starts, so every attach finds it. */
  private registration: Promise<Assignment> | null = null;
  private client: ControllerClient | null = null;
  private worker: WorkerClient | null = null;
  private child: ChildProcess | null = null;
  /** Local processes waiting at the barrier of `step`, by local rank. */
  private waiting: { step: number; ranks: Map<number, Waiter> } | null = null;
  /** Local processes that saved their checkpoint, by local rank, and the bytes they wrote in all. */
  private saving: { ranks: Map<number, Waiter>; directive: Extract<Directive, { kind: "migrate-out" }>; step: number; asked: number; written: number } | null = null;
  private stopped = false;
  /** Whether the local processes reached their first barrier. */
  private trained = false;
  /** When the local processes were last told to re-form their group; null once they trained on. */
  private reformedAt: number | null = null;
  /** When the local processes last all reached a barrier, and how long the recent steps took. */
  private lastBarrierAt: number | null = null;
  private readonly stepSeconds: number[] = [];

  constructor(private readonly options: LauncherOptions) {}

  /** Each local process's share of the checkpoint staging. */
  get share(): number {
    return Math.floor(this.options.checkpointBytes / this.options.torchrun.nprocPerNode / PAGE) * PAGE;
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
    const stopHeartbeat = startHeartbeat(this.client, options.worker, options.log);
    try {
      this.worker = new WorkerClient(this.client, options.worker, options.parallelism, {
        checkpointBytes: options.checkpointBytes,
        ...(options.replacementName === undefined ? {} : { replacement: options.replacementName }),
        ...(options.replacement ? { token: options.replacement.MONKEYTREE_TOKEN } : {}),
      });
      this.registration = Promise.race([this.worker.register(), refused]);
      // Observed here so a refusal during torchrun's start is not an unhandled rejection.
      this.registration.catch(() => undefined);
      // torchrun starts while the registration waits (for the job's other workers, or for a
      // replacement's move to commit): Python and the model load meanwhile, and the processes'
      // attach is answered once the assignment is here.
      const { exited } = await this.startTorchrun(channel.path);
      try {
        this.assignment = await this.registration!;
        this.groupOf(0);
        // Allocated (and its pages faulted in) once, before training: at a migration it is ready.
        this.outbox = StagingBuffer.create({ size: options.checkpointBytes, lock: false });
      } catch (error) {
        this.terminate("SIGTERM");
        await exited;
        throw error;
      }
      this.enter("running", `node rank ${this.assignment.nodeRank} of ${this.assignment.nodes}, generation ${this.assignment.generation}`);
      const code = await exited;
      if (code === 0 && !this.stopped) {
        await this.client.finish(options.worker.job);
        this.enter("exited", "training ended; the job is finished");
      } else {
        this.enter("exited", this.stopped ? "stopped" : `torchrun failed with ${code}`);
      }
      return code;
    } finally {
      stopHeartbeat();
      this.outbox?.free();
      await channel.close();
      await this.client.close();
    }
  }

  /** Stops torchrun (on SIGINT or SIGTERM to the launcher). */
  terminate(signal: NodeJS.Signals): void {
    this.child?.kill(signal);
  }

  /** Every step passes through holding and back: those transitions are logged at debug level. */
  private enter(state: LauncherState, why: string, routine = false): void {
    const from = this.state;
    (routine ? this.options.log.debug : this.options.log.info)(() => `${from} → ${state}: ${why}`);
    this.state = state;
  }

  /** Starts torchrun; resolves once it runs (or failed to), with a promise of its exit code. */
  private async startTorchrun(channel: string): Promise<{ exited: Promise<number> }> {
    const [program, ...args] = this.options.torchrun.local(await unusedPort());
    const child = spawn(program!, args, { stdio: ["ignore", "inherit", "inherit"], env: { ...process.env, [CHANNEL_ENV]: channel, [CRC32C_LIBRARY_ENV]: crc32cLibraryPath } });
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
        return this.registration!.then(() => this.attached(request.localRank));
      case "barrier":
        return new Promise((resolve) => this.arrive(request.localRank, request.step, resolve));
      case "saved":
        return new Promise((resolve) => this.saved(request.localRank, request.bytes, resolve));
    }
  }

  /** The group values a local process forms its group with, and for a replacement where its checkpoint is. */
  private attached(localRank: number): ChannelReply {
    const r = this.options.replacement;
    const resume = r && {
      buffer: r.MONKEYTREE_STAGING_BUFFER,
      offset: r.MONKEYTREE_STAGING_OFFSET + localRank * this.share,
      length: this.share,
      step: this.assignment!.resumeStep ?? 0,
    };
    return { v: CHANNEL_VERSION, type: "attached", ...this.groupOf(localRank), localRank, resume };
  }

  private arrive(localRank: number, step: number, reply: Waiter): void {
    if (this.waiting && this.waiting.step !== step) {
      reply(error(`local rank ${localRank} is at step ${step} while the others wait at step ${this.waiting.step}; every process must call barrier once per step`));
      return;
    }
    this.waiting ??= { step, ranks: new Map() };
    this.waiting.ranks.set(localRank, reply);
    if (this.waiting.ranks.size < this.options.torchrun.nprocPerNode) return;
    const { ranks } = this.waiting;
    this.waiting = null;
    void this.meet(step, ranks);
  }

  /** All local processes are at `step`: ask the controller, and tell each what to do. */
  private async meet(step: number, ranks: Map<number, Waiter>): Promise<void> {
    this.enter("holding", `barrier ${step}`, true);
    if (step % PROGRESS_EVERY === 0 || !this.trained) this.options.log.info(() => `every local process at barrier ${step}`);
    this.trained = true;
    const now = performance.now();
    if (this.reformedAt !== null) {
      const seconds = (now - this.reformedAt) / 1000;
      const usual = median(this.stepSeconds);
      this.options.log.info(() => `training resumed: every local process reached barrier ${step}, ${seconds.toFixed(3)} s after the group was told to re-form (a step took ${usual.toFixed(3)} s before)`);
      this.reformedAt = null;
    } else if (this.lastBarrierAt !== null) {
      this.stepSeconds.push((now - this.lastBarrierAt) / 1000);
      if (this.stepSeconds.length > STEP_HISTORY) this.stepSeconds.shift();
    }
    this.lastBarrierAt = now;
    const directive = await this.worker!.barrier(step);
    if (directive.kind === "migrate-out") {
      const asked = performance.now();
      this.enter("saving", `migration ${directive.migration} to host ${directive.to} at step ${step}`);
      this.saving = { ranks: new Map(), directive, step, asked, written: 0 };
      for (const [localRank, reply] of ranks) {
        reply({ v: CHANNEL_VERSION, type: "directive", directive: { kind: "migrate-out", buffer: this.outbox!.name, offset: localRank * this.share, length: this.share } });
      }
      return;
    }
    this.answer(ranks, directive);
  }

  private saved(localRank: number, bytes: number, reply: Waiter): void {
    const saving = this.saving;
    if (!saving) return reply(error("saved without a migrate-out to answer"));
    if (bytes > this.share) return reply(error(`local rank ${localRank} saved ${bytes} bytes into a ${this.share}-byte range`));
    if (!saving.ranks.has(localRank)) saving.written += bytes;
    saving.ranks.set(localRank, reply);
    if (saving.ranks.size === this.options.torchrun.nprocPerNode) void this.sendCheckpoint(saving);
  }

  private async sendCheckpoint(saving: NonNullable<Launcher["saving"]>): Promise<void> {
    const { directive, step } = saving;
    this.enter("sending", `${this.options.checkpointBytes} bytes to ${directive.endpoint}; every local process saved, ${saving.written} bytes in all, ${((performance.now() - saving.asked) / 1000).toFixed(3)} s after migrate-out`);
    const started = performance.now();
    try {
      const result = await send({ ticket: ticketFor(directive.endpoint, directive.token, this.options.checkpointBytes), buffer: this.outbox! });
      this.options.log.info(() => `migration ${directive.migration}: sent ${result.bytes} bytes in ${((performance.now() - started) / 1000).toFixed(3)} s over ${result.transport}`);
    } catch (failure) {
      // The destination reports the failure (or goes silent); the controller rolls back.
      this.options.log.warn(() => `migration ${directive.migration}: the checkpoint did not reach host ${directive.to}: ${(failure as Error).message}`);
    } finally {
      this.saving = null;
    }
    this.enter("holding", `barrier ${step} again, for the migration's outcome`);
    this.answer(saving.ranks, await this.worker!.barrier(step));
  }

  private answer(ranks: Map<number, Waiter>, directive: Directive): void {
    if (directive.kind === "reconfigure") {
      this.assignment = directive.assignment;
      this.reformedAt = performance.now();
    }
    if (directive.kind === "stop") {
      this.stopped = true;
      this.enter("stopping", directive.reason);
    } else {
      this.enter("running", directive.kind === "reconfigure" ? `re-forming at generation ${directive.assignment.generation}` : "continue", directive.kind === "continue");
    }
    for (const [localRank, reply] of ranks) reply({ v: CHANNEL_VERSION, type: "directive", directive: this.translate(directive, localRank) });
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
        // A second migrate-out for the same step cannot happen: the controller holds the job until the first is decided.
        return { kind: "stop", reason: `unexpected second migrate-out (${directive.migration})` };
    }
  }
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.floor(sorted.length / 2)]! : NaN;
}

const error = (message: string): ChannelReply => ({ v: CHANNEL_VERSION, type: "error", message });
