import { Router } from "zeromq";

/** A bare ROUTER standing in for the controller, so each test decides what goes back and when. */
export class FakeController {
  readonly router: Router;
  private readonly frames: { frame: Buffer; auth: Buffer | undefined }[] = [];
  /** The raw frame and the auth frame (when one came) of the message `next` returned last. */
  last: { frame: Buffer; auth: Buffer | undefined } | null = null;
  private identity: Buffer | null = null;
  private wake: (() => void) | null = null;

  private constructor(
    router: Router,
    readonly endpoint: string,
  ) {
    this.router = router;
    void this.receive();
  }

  static async start(curveSecretKey?: string): Promise<FakeController> {
    const router = new Router({ linger: 0 });
    if (curveSecretKey !== undefined) {
      router.curveServer = true;
      router.curveSecretKey = curveSecretKey;
    }
    await router.bind("tcp://127.0.0.1:*");
    return new FakeController(router, router.lastEndpoint!);
  }

  /** The next frame a connection sent, parsed; with `type`, the next of that type (others are dropped). */
  async next(type?: string): Promise<Record<string, unknown>> {
    for (;;) {
      while (this.frames.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
      this.last = this.frames.shift()!;
      const message = JSON.parse(this.last.frame.toString()) as Record<string, unknown>;
      if (type === undefined || message.type === type) return message;
    }
  }

  async send(message: object): Promise<void> {
    await this.router.send([this.identity!, JSON.stringify(message)]);
  }

  close(): void {
    this.router.close();
  }

  private async receive(): Promise<void> {
    try {
      for await (const [identity, frame, auth] of this.router) {
        this.identity = identity!;
        this.frames.push({ frame: frame!, auth });
        this.wake?.();
      }
    } catch {
      // Closed.
    }
  }
}

/** Polls a condition that some asynchronous delivery will make true. */
export async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}
