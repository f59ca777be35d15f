import { z } from "zod";
import { formatZodError, quote } from "../errors.ts";
import { CommandReplySchema, CommandSchema, type Command, type CommandReply } from "./commands.ts";
import { AckSchema, HeartbeatSchema, HostRegisterSchema, ReplacementExitedSchema, TransferResultSchema, VouchSchema } from "./daemon.ts";
import { EnvelopeSchema, PROTOCOL_VERSION } from "./envelope.ts";
import { ErrorReplySchema, ProtocolError } from "./errors.ts";
import { EventsReplySchema, EventsRequestSchema } from "./events.ts";
import { StatusReportSchema, StatusRequestSchema } from "./status.ts";
import { FinishedSchema, FinishSchema, OrderMessageSchema, RegisteredSchema, RegisterSchema, ReportSchema } from "./worker.ts";

/** Everything a controller accepts. */
export const RequestSchema = z.discriminatedUnion("type", [
  RegisterSchema,
  ReportSchema,
  FinishSchema,
  HostRegisterSchema,
  HeartbeatSchema,
  TransferResultSchema,
  ReplacementExitedSchema,
  VouchSchema,
  StatusRequestSchema,
  EventsRequestSchema,
]);
export type Request = z.infer<typeof RequestSchema>;
export type RequestType = Request["type"];

/** Everything a controller answers. */
export const ReplySchema = z.discriminatedUnion("type", [
  RegisteredSchema,
  OrderMessageSchema,
  FinishedSchema,
  AckSchema,
  StatusReportSchema,
  EventsReplySchema,
  ErrorReplySchema,
]);
export type Reply = z.infer<typeof ReplySchema>;

const requestTypes: ReadonlySet<string> = new Set(RequestSchema.options.map((o) => o.shape.type.value));
const replyTypes: ReadonlySet<string> = new Set(ReplySchema.options.map((o) => o.shape.type.value));
const commandTypes: ReadonlySet<string> = new Set(CommandSchema.options.map((o) => o.shape.type.value));
const commandReplyTypes: ReadonlySet<string> = new Set(CommandReplySchema.options.map((o) => o.shape.type.value));

export type Decoded<T> = { success: true; data: T } | { success: false; error: ProtocolError; id: number | null };

/** Decodes one frame as a request; failures carry the request id when it could be read. */
export const safeDecodeRequest = (frame: Uint8Array | string): Decoded<Request> => decode(frame, RequestSchema, requestTypes, "request", "controller");

/** Decodes one frame as a reply. */
export const safeDecodeReply = (frame: Uint8Array | string): Decoded<Reply> => decode(frame, ReplySchema, replyTypes, "reply", "client");

/** Decodes one frame a daemon receives from the controller as a command. */
export const safeDecodeCommand = (frame: Uint8Array | string): Decoded<Command> => decode(frame, CommandSchema, commandTypes, "command", "client");

/** Decodes one frame as a daemon's answer to a command. */
export const safeDecodeCommandReply = (frame: Uint8Array | string): Decoded<CommandReply> =>
  decode(frame, CommandReplySchema, commandReplyTypes, "command reply", "controller");

/** Throwing form of `safeDecodeRequest`. */
export function decodeRequest(frame: Uint8Array | string): Request {
  const result = safeDecodeRequest(frame);
  if (!result.success) throw result.error;
  return result.data;
}

export const encode = (message: Request | Reply | Command | CommandReply): string => JSON.stringify(message);

/** `side`: who decodes, named in a version refusal. */
function decode<T>(frame: Uint8Array | string, schema: z.ZodType<T>, types: ReadonlySet<string>, what: string, side: "controller" | "client"): Decoded<T> {
  let value: unknown;
  try {
    value = JSON.parse(typeof frame === "string" ? frame : Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength).toString("utf8"));
  } catch (error) {
    return fail<T>(new ProtocolError("malformed", `the ${what} is not JSON (${(error as Error).message}); send one JSON object per frame`));
  }
  // Nearly every frame is well formed, and its message's schema (which fixes the version and
  // type) accepts it in one pass. Only a frame it refuses goes through the checks below, in
  // order, for the error that names the problem best.
  const whole = schema.safeParse(value);
  if (whole.success) return { success: true, data: whole.data };
  const head = EnvelopeSchema.safeParse(value);
  if (!head.success) return fail<T>(new ProtocolError("malformed", formatZodError(`${what} envelope`, head.error)));
  const { v, type, id } = head.data;
  if (v !== PROTOCOL_VERSION) {
    return fail<T>(
      new ProtocolError(
        "unsupported_version",
        `protocol version ${v} is not supported: this ${side} speaks version ${PROTOCOL_VERSION}; run the same MonkeyTree release on the controller, the daemons and the launchers`,
      ),
      id,
    );
  }
  if (!types.has(type)) {
    return fail<T>(new ProtocolError("unknown_type", `unknown ${what} type ${quote(type)}; expected one of ${[...types].join(", ")}`), id);
  }
  return fail<T>(new ProtocolError("malformed", formatZodError(type, whole.error)), id);
}

const fail = <T>(error: ProtocolError, id: number | null = null): Decoded<T> => ({ success: false, error, id });
