import { encode } from "../../sdk/contract/protocol/codec.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { Command, CommandReply, RefusalCode } from "../../sdk/contract/protocol/commands.ts";
import type { ReplacementLauncher, ReplacementRequest, StagingGrant, StagingRequest, StagingTransport } from "./transport.ts";

export const DEFAULT_COMMAND_TIMEOUT_MS = 5_000;

/**
 * The slowest a loaded host's daemon is taken to zero-fill and map a grant's staging file, in
 * bytes per millisecond (64 MiB/s): a prepare waits this long for its bytes on top of the
 * command timeout. A 1 GiB file took 0.6 s on an idle 2-core machine and 2.1 s beside six busy
 * processes; beside two jobs training it outlasted 5 s, and every 1 GiB move rolled back. The
 * job trains on while its move stages, so the wait costs it nothing.
 */
export const SLOWEST_STAGING_BYTES_PER_MS = (64 * 2 ** 20) / 1000;

/**
 * The longest a prepare waits, whatever bytes a job declared (30 minutes, 112.5 GiB at the
 * slowest rate): a job's `checkpointBytes` is its own word, and a timer past 2^31 - 1 ms would
 * fire at once.
 */
export const MAX_PREPARE_WAIT_MS = 30 * 60_000;

/**
 * Why a command to a host's daemon failed: `no_daemon` (none registered for the host),
 * `timeout` (no answer in time: the daemon died or is unreachable), `closed` (the controller is
 * stopping), `unexpected_reply`, or the daemon's own refusal code.
 */
export type DaemonCommandErrorCode = "no_daemon" | "timeout" | "closed" | "unexpected_reply" | RefusalCode;

export class DaemonCommandError extends Error {
  override readonly name = "DaemonCommandError";
  constructor(
    readonly code: DaemonCommandErrorCode,
    readonly host: number,
    message: string,
  ) {
    super(message);
  }
}

/** Hands one frame to the controller's ROUTER for the peer with this routing identity. */
export type SendToPeer = (peer: Uint8Array, frame: string) => void;

type CommandBody = Command extends infer C ? (C extends Command ? Omit<C, "v" | "id"> : never) : never;

interface Waiting {
  readonly host: number;
  readonly peer: Uint8Array;
  readonly resolve: (reply: CommandReply) => void;
  readonly reject: (error: DaemonCommandError) => void;
}

/**
 * Staging and replacement launches carried out by the per-host daemons, over the controller's
 * own socket: the server tells it which routing identity registered each host and passes it
 * the daemons' answers. Commands are not resent (a prepare is not idempotent on the daemon),
 * so a daemon that does not answer in time fails the command, and the migration rolls back.
 */
export class DaemonHosts implements StagingTransport, ReplacementLauncher {
  /** Each host's daemon: the routing identity and transfer endpoint of its accepted registration. */
  private readonly peers = new Map<number, { readonly peer: Uint8Array; readonly endpoint: string }>();
  private readonly waiting = new Map<number, Waiting>();
  private nextId = 1;
  private sendFrame: SendToPeer | null = null;

  constructor(private readonly timeoutMs = DEFAULT_COMMAND_TIMEOUT_MS) {}

  /** Called by the server once its socket is open. */
  attach(send: SendToPeer): void {
    this.sendFrame = send;
  }

  /** Hosts with a registered daemon: only registrations the controller accepted, so at most its host count. */
  get size(): number {
    return this.peers.size;
  }

  /**
   * The controller accepted `host`'s registration from `peer` (the daemon's own, after a
   * reconnection): commands to the host go there, and its grants name `endpoint`.
   */
  register(host: number, peer: Uint8Array, endpoint: string): void {
    this.peers.set(host, { peer: Uint8Array.from(peer), endpoint });
  }

  /**
   * A daemon answered a command; answers to nothing waiting (late, from another peer, or about
   * another host) are dropped.
   */
  answer(peer: Uint8Array, reply: CommandReply): void {
    const waiting = this.waiting.get(reply.id);
    if (!waiting || waiting.host !== reply.host || !Buffer.from(waiting.peer).equals(Buffer.from(peer))) return;
    if (reply.type === "daemon.refused") {
      waiting.reject(new DaemonCommandError(reply.code, waiting.host, `the daemon on host ${waiting.host} refused: ${reply.message}`));
    } else {
      waiting.resolve(reply);
    }
  }

  /** Fails every command still waiting; the server calls it when it stops. */
  close(): void {
    for (const waiting of [...this.waiting.values()]) {
      waiting.reject(new DaemonCommandError("closed", waiting.host, `the controller stopped before the daemon on host ${waiting.host} answered`));
    }
    this.sendFrame = null;
  }

  async prepare({ host, ...body }: StagingRequest): Promise<StagingGrant> {
    const waitMs = Math.min(this.timeoutMs + body.bytes / SLOWEST_STAGING_BYTES_PER_MS, MAX_PREPARE_WAIT_MS);
    const reply = await this.command(host, { type: "daemon.prepare", ...body }, waitMs);
    if (reply.type !== "daemon.prepared") throw unexpected(host, "daemon.prepare", reply);
    // A ticket names only the endpoint the host's daemon registered with, under its own key.
    const registered = this.peers.get(host)?.endpoint;
    if (reply.endpoint !== registered) {
      throw new DaemonCommandError(
        "unexpected_reply",
        host,
        `the daemon on host ${host} granted staging at ${reply.endpoint}, not at ${registered ?? "a registered endpoint"}`,
      );
    }
    return { endpoint: reply.endpoint, token: reply.token };
  }

  async release(host: number, token: string): Promise<void> {
    const reply = await this.command(host, { type: "daemon.release", token });
    if (reply.type !== "daemon.done") throw unexpected(host, "daemon.release", reply);
  }

  async spawn({ host, ...body }: ReplacementRequest): Promise<void> {
    const reply = await this.command(host, { type: "daemon.spawn", ...body });
    if (reply.type !== "daemon.done") throw unexpected(host, "daemon.spawn", reply);
  }

  private command(host: number, body: CommandBody, timeoutMs = this.timeoutMs): Promise<CommandReply> {
    const peer = this.peers.get(host)?.peer;
    const send = this.sendFrame;
    if (!peer || !send) {
      return Promise.reject(
        new DaemonCommandError("no_daemon", host, `no daemon is registered for host ${host}; start \`monkeytree daemon --host ${host}\` there`),
      );
    }
    const id = this.nextId++;
    return new Promise<CommandReply>((resolve, reject) => {
      const deadline = setTimeout(
        () =>
          settle(() =>
            reject(new DaemonCommandError("timeout", host, `the daemon on host ${host} did not answer ${body.type} #${id} within ${Math.round(timeoutMs)} ms`)),
          ),
        timeoutMs,
      );
      const settle = (finish: () => void) => {
        clearTimeout(deadline);
        this.waiting.delete(id);
        finish();
      };
      this.waiting.set(id, { host, peer, resolve: (r) => settle(() => resolve(r)), reject: (e) => settle(() => reject(e)) });
      send(peer, encode({ ...body, v: PROTOCOL_VERSION, id } as Command));
    });
  }
}

const unexpected = (host: number, command: string, reply: CommandReply) =>
  new DaemonCommandError("unexpected_reply", host, `the daemon on host ${host} answered ${command} with ${reply.type}`);
