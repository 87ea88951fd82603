// Wire types of api/openapi.yaml under short names (generated in schema.ts).

import type { components } from "./schema.js";

type S = components["schemas"];

export type { components, paths } from "./schema.js";

export type ErrorBody = S["ErrorBody"];
export type Health = S["Health"];
export type CreateSandbox = S["CreateSandbox"];
export type SandboxInfo = S["Sandbox"];
export type SandboxState = S["Sandbox"]["state"];
export type DataPlane = S["DataPlane"];
export type VMInfo = S["VMInfo"];
export type Exec = S["Exec"];
export type WinSize = S["WinSize"];
export type Process = S["Process"];
export type Exit = S["Exit"];
export type Event = S["Event"];
export type Control = S["Control"];
export type FileInfo = S["FileInfo"];
export type FileEvent = S["FileEvent"];
export type FileList = S["FileList"];
export type FileWritten = S["FileWritten"];
export type TarWritten = S["TarWritten"];
export type PortState = S["PortState"];
export type APIKey = S["APIKey"];
export type Secret = S["Secret"];
export type Quota = S["Quota"];
export type QuotaUsage = S["QuotaUsage"];
export type Worker = S["Worker"];
export type Snapshot = S["Snapshot"];
export type CheckpointPolicy = S["CheckpointPolicy"];
export type Checkpoint = S["Checkpoint"];
export type CheckpointList = S["CheckpointList"];
export type SandboxMetrics = S["SandboxMetrics"];
export type UsageSample = S["UsageSample"];
export type Template = S["Template"];
export type BuildReport = S["BuildReport"];
export type BuildEvent = S["BuildEvent"];
export type Network = S["Network"];
export type EgressEvent = S["EgressEvent"];

/** CommandResultLike is what CommandExitError needs of a CommandResult. */
export interface CommandResultLike {
  readonly exitCode: number;
  readonly stderr: string;
}
