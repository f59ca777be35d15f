import { connect } from "node:net";
import { LocalVouchReplySchema, MAX_LOCAL_VOUCH_BYTES } from "../../contract/protocol/vouch.ts";

/** The host's daemon would not vouch, or could not be asked; `absent` when no daemon listens there. */
export class VouchError extends Error {
  override readonly name = "VouchError";
  constructor(
    message: string,
    readonly absent = false,
  ) {
    super(message);
  }
}

/**
 * Asks the daemon at the local socket `path` to vouch to the controller that a launcher of
 * `job` runs on this host. Resolves once the controller took the daemon's word.
 */
export function askToVouch(path: string, job: string, timeoutMs = 10_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    let reply = "";
    const fail = (error: VouchError) => {
      socket.destroy();
      reject(error);
    };
    socket.setTimeout(timeoutMs, () => fail(new VouchError(`the daemon at ${path} did not answer within ${timeoutMs / 1000} s`)));
    socket.once("error", (error: NodeJS.ErrnoException) => {
      const absent = error.code === "ENOENT" || error.code === "ECONNREFUSED";
      fail(new VouchError(absent ? `no daemon listens at ${path}` : `${path}: ${error.message}`, absent));
    });
    socket.once("connect", () => socket.write(`${JSON.stringify({ job })}\n`));
    socket.on("data", (chunk: Buffer) => {
      reply += chunk.toString("utf8");
      if (reply.length > MAX_LOCAL_VOUCH_BYTES) fail(new VouchError(`the daemon at ${path} answered more than a reply`));
    });
    socket.once("end", () => {
      let parsed: unknown = null;
      try {
        parsed = JSON.parse(reply);
      } catch {
        // Judged below.
      }
      const answer = LocalVouchReplySchema.safeParse(parsed);
      if (!answer.success) return fail(new VouchError(`the daemon at ${path} answered something else than a vouch`));
      if ("error" in answer.data) return fail(new VouchError(answer.data.error));
      socket.destroy();
      resolve();
    });
  });
}
