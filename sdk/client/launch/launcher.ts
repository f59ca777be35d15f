import { spawn, type ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { crc32cLibraryPath, send, StagingBuffer } from "../../../native/index.ts";
import { HostAgent } from "../agent.ts";
import { NO_STOP, type Answer } from "../hold.ts";
import { ControllerClient } from "../client.ts";
import type { ControllerRefusedError } from "../connection.ts";
import { askToVouch, VouchError } from "./vouch.ts";
import { ticketFor } from "../../contract/protocol/endpoint.ts";
import type { Logger } from "../../contract/log.ts";
import {
  CHANNEL_ENV,
  CHANNEL_VERSION,
  CRC32C_LIBRARY_ENV,
  EXPECTED_NODE_RANK_ENV,
  EXPECTED_NODES_ENV,
  INBOX_ENV,
  INBOX_OFFSET_ENV,
  OUTBOX_ENV,
  RESUMING_ENV,
  SHARE_ENV,
  type ChannelDirective,
  type ChannelReply,
  type ChannelRequest,
} from "../../contract/protocol/channel.ts";
import type { ReplacementEnv } from "../../contract/protocol/replacement.ts";
import type { Assignment, Directive, Parallelism, WorkerIdentity } from "../../contract/protocol/worker.ts";
import { ChannelServer } from "./channel-server.ts";
import {
  launching,
  LaunchError,
  masterUnknown,
  transition,
  type LauncherAction,
  type LauncherEvent,
  type LauncherState,
  type SendOutcome,
} from "./launcher-state.ts";
import type { TorchrunCommand } from "./torchrun.ts";
import type { Credential } from "../../contract/protocol/auth.ts";

export { LaunchError, type LauncherState } from "./launcher-state.ts";

/**
 * `monkeytree launch`'s agent, in the manner of torchrun's elastic agent. It registers this
 * host's worker, starts torchrun with a local channel, and answers its processes' barriers on
 * this host (`HostAgent`, whose stop-point state machine is `sdk/client/hold.ts`): `continue` without
 * a word to the controller, unless the job stops for a move; then the processes re-form their
 * process group (`reconfigure`), save into a staging buffer that the launcher sends to the
 * destination (`migrate-out`), or exit (`stop`).
 *
 *   registering → starting (torchrun starts while the registration waits) → running → exited
 *
 * What it does in each state, and on what, is `launcher-state.ts`: the launcher feeds it what
 * happens and carries out what it answers.
 */

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

const PAGE = 4096;

export class Launcher {
  private state: LauncherState;
  /** Where the local processes save their checkpoints at a migration (`--checkpoint-bytes`). */
  private outbox: StagingBuffer | null = null;
  /** The control block: the stop word, then one word per local process (sdk/contract/protocol/channel.ts). */
  private control: StagingBuffer | null = null;
  /** Set before torchrun starts, so every attach finds it. */
  private registration: Promise<Assignment> | null = null;
  private client: ControllerClient | null = null;
  private agent: HostAgent | null = null;
  private child: ChildProcess | null = null;
  /** Settles once every local process waits at attach (the `all-attached` action). */
  private allAttached: () => void = () => {};
  private readonly attached = new Promise<void>((resolve) => (this.allAttached = resolve));
  /** What `run` ends with: the `end` and `fail` actions settle it. */
  private end: (code: number) => void = () => {};
  private fail: (error: Error) => void = () => {};
  private readonly ended = new Promise<number>((resolve, reject) => {
    this.end = resolve;
    this.fail = reject;
  });

  constructor(private readonly options: LauncherOptions) {
    this.state = launching(options.torchrun.nprocPerNode);
  }

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
    if (this.share === 0)
      throw new LaunchError(`--checkpoint-bytes ${options.checkpointBytes} leaves less than a page for each of ${options.torchrun.nprocPerNode} processes`);
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
        onSend: (migrateOut) => this.apply({ type: "all-saved", migrateOut, bytes: options.checkpointBytes }),
        onStep: (step) => this.apply({ type: "barrier", step }),
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
      this.registration = Promise.race([ready.then(() => agent.register()), refused]);
      // Taken first: the processes' attach replies, chained on the registration too, find the
      // assignment in the state.
      void this.registration.then(
        (assignment) => this.apply({ type: "registered", assignment }),
        (error: unknown) => this.apply({ type: "refused", error: error as Error }),
      );
      // torchrun starts while the registration waits (for the job's other workers, or for a
      // replacement's move to commit): Python and the script load meanwhile, and the processes'
      // attach is answered once the assignment is here.
      this.startTorchrun(channel.path);
      return await this.ended;
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

  private apply(event: LauncherEvent): void {
    const { state, actions, log } = transition(this.state, event, performance.now());
    this.state = state;
    for (const { level, text } of log) this.options.log[level](() => text);
    for (const action of actions) this.carryOut(action);
  }

  private carryOut(action: LauncherAction): void {
    switch (action.type) {
      case "all-attached":
        this.allAttached();
        return;
      case "terminate":
        this.terminate(action.signal);
        return;
      case "finish":
        void this.finish();
        return;
      case "send":
        void this.sendCheckpoint(action.migrateOut, action.at);
        return;
      case "end":
        this.end(action.code);
        return;
      case "fail":
        this.fail(action.error);
        return;
    }
  }

  /** Tells the controller the job ended; a controller that is down is waited for only so long. */
  private async finish(): Promise<void> {
    try {
      await this.client!.finish(this.options.worker.job);
    } catch (error) {
      this.options.log.warn(
        () =>
          `the controller did not hear that job ${this.options.worker.job} finished (${(error as Error).message}); it ends the job once its workers are lost`,
      );
    }
    this.apply({ type: "finished" });
  }

  /** Starts torchrun, whose start and end come back as events. */
  private startTorchrun(channel: string): void {
    const [program, ...args] = this.options.torchrun.local;
    const ranges = { [OUTBOX_ENV]: this.outbox!.name, [SHARE_ENV]: String(this.share) };
    const env = { ...process.env, [CHANNEL_ENV]: channel, [CRC32C_LIBRARY_ENV]: crc32cLibraryPath, ...ranges, ...this.resumingEnv() };
    const child = spawn(program!, args, { stdio: ["ignore", "inherit", "inherit"], env });
    this.child = child;
    child.once("spawn", () => this.apply({ type: "spawned", pid: child.pid }));
    // Node may report an exit after an error: torchrun ends once, with whichever comes first.
    void new Promise<LauncherEvent>((resolve) => {
      child.once("error", (error) => resolve({ type: "spawn-failed", program: child.spawnfile, message: error.message }));
      child.once("exit", (code, signal) => resolve({ type: "exited", code: code ?? (signal ? 128 + 15 : 1) }));
    }).then((event) => this.apply(event));
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

  /** The process-group values of one local rank under `a`. */
  private groupOf(a: Assignment, localRank: number) {
    if (a.masterAddress === null) throw masterUnknown(a);
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
        this.apply({ type: "attached", localRank: request.localRank });
        return this.registration!.then(() => this.attachReply(request.localRank));
      case "barrier":
        return this.agent!.arrive(request.localRank, request.step).then((answer) => this.reply(answer, request.localRank));
      case "saved":
        if (request.bytes > this.share)
          return Promise.resolve(error(`local rank ${request.localRank} saved ${request.bytes} bytes into a ${this.share}-byte range`));
        this.apply({ type: "saved", bytes: request.bytes });
        return this.agent!.saved(request.localRank).then((answer) => this.reply(answer, request.localRank));
    }
  }

  /** The group values a local process forms its group with, and for a replacement where its checkpoint is. */
  private attachReply(localRank: number): ChannelReply {
    const state = this.state;
    // A registration without a master address is answered, but leads nowhere: the attach says why.
    if (state.phase === "aborting") throw state.error;
    if (state.phase !== "running") throw new Error(`this host's worker has no assignment while the launcher is ${state.phase}`);
    const r = this.options.replacement;
    const resume = r && {
      buffer: r.MONKEYTREE_STAGING_BUFFER,
      offset: r.MONKEYTREE_STAGING_OFFSET + localRank * this.share,
      length: this.share,
      step: state.assignment.resumeStep ?? 0,
    };
    const control = { buffer: this.control!.name, stopOffset: 0, slotOffset: 8 * (1 + localRank) };
    return { v: CHANNEL_VERSION, type: "attached", ...this.groupOf(state.assignment, localRank), localRank, resume, control };
  }

  private reply(answer: Answer, localRank: number): ChannelReply {
    if (answer.kind === "error") return error(answer.message);
    if (answer.kind === "reconfigure") this.apply({ type: "reconfigure", assignment: answer.assignment });
    if (answer.kind === "stop" || answer.kind === "migrate-out") this.apply({ type: answer.kind });
    return { v: CHANNEL_VERSION, type: "directive", directive: this.translate(answer, localRank) };
  }

  private translate(directive: Directive, localRank: number): ChannelDirective {
    switch (directive.kind) {
      case "continue":
        return { kind: "continue" };
      case "stop":
        return { kind: "stop", reason: directive.reason };
      case "reconfigure":
        return { kind: "reconfigure", ...this.groupOf(directive.assignment, localRank) };
      case "migrate-out":
        return { kind: "migrate-out", buffer: this.outbox!.name, offset: localRank * this.share, length: this.share };
    }
  }

  /** Every local process saved: the host's checkpoint goes to the destination. */
  private async sendCheckpoint(migrateOut: Extract<Directive, { kind: "migrate-out" }>, at: number): Promise<void> {
    let outcome: SendOutcome;
    try {
      const result = await send({ ticket: ticketFor(migrateOut.endpoint, migrateOut.token, this.options.checkpointBytes), buffer: this.outbox! });
      outcome = { bytes: result.bytes, transport: result.transport };
    } catch (failure) {
      outcome = { failure: (failure as Error).message };
    }
    this.apply({ type: "checkpoint-sent", migrateOut, at, outcome });
    this.agent!.sent();
  }
}

const error = (message: string): ChannelReply => ({ v: CHANNEL_VERSION, type: "error", message });
