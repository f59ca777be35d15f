import { z } from "zod";
import { envelope, PROTOCOL_VERSION } from "./envelope.ts";
import { oneLine, textSchema } from "./limits.ts";

/**
 * Why a request was refused. Protocol codes come from decoding; the others from the
 * controller's rules. Every reply error names the field or rule and how to fix it.
 */
export const ErrorCodeSchema = z.enum([
  "malformed",
  "unsupported_version",
  "unknown_type",
  "unknown_job",
  "unknown_worker",
  "conflict",
  "invalid_token",
  "forbidden",
  "internal",
]);
export type ErrorCode = z.infer<typeof ErrorCodeSchema>;

export const ErrorReplySchema = z.strictObject({
  ...envelope("error"),
  code: ErrorCodeSchema,
  message: textSchema("message"),
});
export type ErrorReply = z.infer<typeof ErrorReplySchema>;

/**
 * A message that cannot be decoded or is not allowed; carries the code sent back in the reply.
 * The message is one bounded line, so a reply or log line never grows with what a client sent.
 * `detail` is for the controller's log only and never goes into a reply: what the refusal must
 * not tell the client, such as which other tenant's job holds a host.
 */
export class ProtocolError extends Error {
  override readonly name = "ProtocolError";
  readonly detail: string | null;
  constructor(
    readonly code: ErrorCode,
    message: string,
    detail?: string,
  ) {
    super(oneLine(message));
    this.detail = detail === undefined ? null : oneLine(detail);
  }
}

export const errorReply = (id: number, code: ErrorCode, message: string): ErrorReply => ({
  v: PROTOCOL_VERSION,
  type: "error",
  id,
  code,
  message: oneLine(message),
});
