export * from "./envelope.ts";
export * from "./worker.ts";
export * from "./daemon.ts";
export * from "./commands.ts";
export * from "./status.ts";
export * from "./errors.ts";
export * from "./codec.ts";
export * from "./replacement.ts";
