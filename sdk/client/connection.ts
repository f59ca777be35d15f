import { Dealer, type Event as SocketEvent } from "zeromq";
import type { Logger } from "../contract/log.ts";
import { sharedSecret, signFrame, type Credential } from "../contract/protocol/auth.ts";
import type { CommandReply } from "../contract/protocol/commands.ts";
import { encode, safeDecodeReply, type Reply, type Request } from "../contract/protocol/codec.ts";
import { PROTOCOL_VERSION } from "../contract/protocol/envelope.ts";
import { MAX_REPLY_BYTES } from "../contract/protocol/limits.ts";
import type { ErrorCode, ErrorReply } from "../contract/protocol/errors.ts";

/**
 * One DEALER to the controller, shared by everything that talks to it from one process: the
 * worker client and the host daemon. Requests are idempotent, so a request without an answer
 * is sent again every `retryMs` until its deadline: that rides out a controller restart
 * (ZeroMQ reconnects by itself) and lost replies. Replies are matched to requests by id;
 * every other frame (a command from the controller, the answer to a message sent without
 * waiting, a late duplicate) goes to `onMessage`.
 */

export interface ConnectionOptions {
  /** The controller's address, e.g. `tcp://10.0.0.1:5555`. */
  readonly endpoint: string;
  /**
   * The credential `monkeytree keys` made for this client; required when the controller has a
   * keyring. The connection then speaks CURVE with the credential's keypair and proves every
   * message with its MAC frame (`protocol/auth.ts`).
   */
  readonly credential?: Credential;
  /** Default deadline of a request, in ms; `Infinity` waits until the connection closes. */
  readonly timeoutMs?: number;
  /** Resend an unanswered request this often, in ms. */
  readonly retryMs?: number;
  /** Frames that answer no waiting request, raw: commands, answers to `send`, late duplicates. */
  readonly onMessage?: (frame: Buffer) => void;
  /** Where a message that could not be sent is reported; silent by default. */
  readonly log?: Logger;
  /**
   * Called once if the controller refuses this connection's handshake (see `Refusal`). ZeroMQ
   * reports that only as a socket event and answers nothing, so without this a request just
   * waits for its deadline.
   */
  readonly onRefused?: (error: ControllerRefusedError) => void;
}

/**
 * Why a controller refused the CURVE handshake: it has a keyring and the client no credential,
 * the reverse, or its keyring does not list the credential's key. Retrying changes none of them.
 */
export type Refusal = "credential-required" | "credential-unexpected" | "key-unknown";

const REFUSALS: Record<Refusal, string> = {
  "credential-required": "has a keyring and refused this client, which gave no credential",
  "credential-unexpected": "has no keyring and refused this client, which gave a credential",
  "key-unknown": "refused this client's credential: its keyring does not list the credential's key",
};

/** The controller refused the connection's handshake; `reason` says why. */
export class ControllerRefusedError extends Error {
  override readonly name = "ControllerRefusedError";
  readonly code = "refused";
  constructor(
    readonly reason: Refusal,
    readonly endpoint: string,
  ) {
    super(`the controller at ${endpoint} ${REFUSALS[reason]}`);
  }
}

/** The controller refused a request; `code` says why (see `ErrorCode`). */
export class ControllerError extends Error {
  override readonly name = "ControllerError";
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** No answer before the deadline: the controller is down, unreachable, or holds another key. */
export class ControllerTimeoutError extends Error {
  override readonly name = "ControllerTimeoutError";
  readonly code = "timeout";
  constructor(
    readonly request: string,
    readonly endpoint: string,
    readonly timeoutMs: number,
  ) {
    super(
      `no answer to ${request} from ${endpoint} within ${timeoutMs} ms; check that the controller runs there and, when it has a keyring, that its keyring lists this credential's key`,
    );
  }
}

/** The connection was closed while a request waited. */
export class ClientClosedError extends Error {
  override readonly name = "ClientClosedError";
  readonly code = "closed";
}

/** An answer of another type than the request calls for. */
export class UnexpectedReplyError extends Error {
  override readonly name = "UnexpectedReplyError";
  readonly code = "unexpected_reply";
}

/** A request as its sender writes it: the connection adds the protocol version and the id. */
export type RequestBody = Request extends infer R ? (R extends Request ? Omit<R, "v" | "id"> : never) : never;

/** Every answer but `error`, which rejects the request with `ControllerError`. */
export type Answer = Exclude<Reply, ErrorReply>;

export const DEFAULT_TIMEOUT_MS = 30_000;
export const DEFAULT_RETRY_MS = 1_000;

interface Waiting {
  readonly resolve: (reply: Reply) => void;
  readonly reject: (error: Error) => void;
  /** The next resend, or the deadline. */
  timer: NodeJS.Timeout | undefined;
}

/**
 * The request with its version and id. Copied field by field: V8 serializes the object a
 * spread `{ ...body, v, id }` makes several times slower, and every barrier pays it.
 */
const stamped = (body: RequestBody, id: number): Request => Object.assign({}, body, { v: PROTOCOL_VERSION, id }) as Request;

const silent: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

export class ControllerConnection {
  private readonly socket: Dealer;
  private readonly waiting = new Map<number, Waiting>();
  private nextId = 1;
  /** Messages waiting for the socket, oldest first, and the loop sending them while there are any. */
  private queue: (string | string[])[] = [];
  private sending: Promise<void> | null = null;
  private closed = false;
  private readonly loop: Promise<void>;
  private readonly log: Logger;
  /** With a credential: the auth frame that goes with each message. */
  private readonly sign: ((frame: string) => string) | null;

  constructor(private readonly options: ConnectionOptions) {
    this.log = options.log ?? silent;
    this.socket = new Dealer({ linger: 0, reconnectInterval: 100, reconnectMaxInterval: 1_000, maxMessageSize: MAX_REPLY_BYTES });
    const credential = options.credential;
    this.sign = null;
    if (credential) {
      const secret = sharedSecret(credential, credential.serverKey);
      this.sign = (frame) => signFrame(credential, secret, frame);
      this.socket.curveServerKey = credential.serverKey;
      this.socket.curvePublicKey = credential.publicKey;
      this.socket.curveSecretKey = credential.secretKey;
    }
    // Watched before connecting, so the first handshake's event is not missed.
    if (options.onRefused) void this.watchHandshakes(options.onRefused);
    this.socket.connect(options.endpoint);
    this.loop = this.receive();
  }

  get endpoint(): string {
    return this.options.endpoint;
  }

  /**
   * Sends a request until it is answered or `timeoutMs` passes. An `error` reply rejects with
   * `ControllerError`, no answer in time with `ControllerTimeoutError`, and closing the
   * connection meanwhile with `ClientClosedError`.
   */
  async request(body: RequestBody, timeoutMs = this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS): Promise<Answer> {
    if (this.closed) throw new ClientClosedError("the connection is closed");
    const id = this.nextId++;
    const frame = encode(stamped(body, id));
    const reply = await new Promise<Reply>((resolve, reject) => {
      // One timer per request, for the next resend or the deadline, whichever comes first.
      const retryMs = this.options.retryMs ?? DEFAULT_RETRY_MS;
      const deadline = performance.now() + timeoutMs;
      const waiting: Waiting = { resolve, reject, timer: undefined };
      const wake = () => {
        const left = deadline - performance.now();
        if (left <= 0) return this.take(id)?.reject(new ControllerTimeoutError(`${body.type} #${id}`, this.options.endpoint, timeoutMs));
        this.write(frame);
        waiting.timer = setTimeout(wake, Math.min(retryMs, left));
      };
      waiting.timer = setTimeout(wake, Math.min(retryMs, timeoutMs));
      this.waiting.set(id, waiting);
      this.write(frame);
    });
    if (reply.type === "error") throw new ControllerError(reply.code, reply.message);
    return reply;
  }

  /** Sends a request once, without waiting: its answer goes to `onMessage`. */
  send(body: RequestBody): void {
    if (this.closed) return;
    this.write(encode(stamped(body, this.nextId++)));
  }

  /** Answers a command the controller sent over this connection. */
  answer(reply: CommandReply): void {
    if (this.closed) return;
    this.write(encode(reply));
  }

  /** Closes the socket; requests still waiting reject with `ClientClosedError`. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const id of [...this.waiting.keys()]) this.take(id)?.reject(new ClientClosedError("the connection was closed while waiting"));
    this.socket.close();
    await this.loop;
  }

  /** The request `id` stops waiting: its timer is cleared, and the caller settles it. */
  private take(id: number): Waiting | undefined {
    const waiting = this.waiting.get(id);
    if (!waiting) return undefined;
    clearTimeout(waiting.timer);
    this.waiting.delete(id);
    return waiting;
  }

  private write(frame: string): void {
    this.queue.push(this.sign ? [frame, this.sign(frame)] : frame);
    if (!this.sending) this.sending = this.pump();
  }

  /** ZeroMQ allows one send in flight per socket: one loop sends the queued messages in order. */
  private async pump(): Promise<void> {
    while (this.queue.length) {
      const batch = this.queue;
      this.queue = [];
      for (const message of batch) {
        try {
          await this.socket.send(message);
        } catch (error) {
          // Expected once closing; before that, a waiting request's deadline reports it too.
          if (!this.closed) this.log.warn(() => `message to ${this.options.endpoint} not sent: ${(error as Error).message}`);
        }
      }
    }
    this.sending = null;
  }

  /** Reports the first refused handshake; the socket's events end when it closes. */
  private async watchHandshakes(onRefused: (error: ControllerRefusedError) => void): Promise<void> {
    try {
      for await (const event of this.socket.events) {
        const reason = refusalOf(event, this.options.credential !== undefined);
        if (reason) return onRefused(new ControllerRefusedError(reason, this.options.endpoint));
      }
    } catch (error) {
      if (!this.closed) this.log.error(() => `socket events stopped: ${(error as Error).message}`);
    }
  }

  private async receive(): Promise<void> {
    try {
      for await (const [frame] of this.socket) {
        if (!frame) continue;
        const decoded = safeDecodeReply(frame);
        // A frame of another type (a command) is no reply, even when its id matches a request's.
        const id = decoded.success ? decoded.data.id : decoded.error.code === "unknown_type" ? null : decoded.id;
        const waiting = id === null ? undefined : this.take(id);
        if (!waiting) this.deliver(frame);
        else if (decoded.success) waiting.resolve(decoded.data);
        else if (decoded.error.code === "unsupported_version")
          waiting.reject(
            new ControllerError(decoded.error.code, `the controller at ${this.options.endpoint} speaks another protocol version: ${decoded.error.message}`),
          );
        else waiting.reject(new ControllerError(decoded.error.code, `the controller's answer could not be read: ${decoded.error.message}`));
      }
    } catch (error) {
      // The iterator ends with an error only when the socket is closed under it.
      if (!this.closed) this.log.error(() => `receive loop stopped: ${(error as Error).message}`);
    }
  }

  /** Hands a frame no request waits for to `onMessage`; one it fails on must not stop the loop that reads the next. */
  private deliver(frame: Buffer): void {
    try {
      this.options.onMessage?.(frame);
    } catch (error) {
      this.log.error(() => `a message from the controller could not be handled: ${(error as Error).message}`);
    }
  }
}

/**
 * The refusal a socket event reports: a security mechanism other than the controller's (CURVE
 * against plain, or plain against CURVE), or a key its keyring does not list.
 */
function refusalOf(event: SocketEvent, credential: boolean): Refusal | null {
  if (event.type === "handshake:error:auth") return "key-unknown";
  if (event.type === "handshake:error:protocol" && event.error.code === "ERR_ZMTP_MECHANISM_MISMATCH")
    return credential ? "credential-unexpected" : "credential-required";
  return null;
}
