"""CUDA runtime errors and NVML faults, classified into the seed's health classes (seed §4.3).

The seed (§4.3) maps GPU errors to a health score and an action:

===========================  =====  ==========  ===================================================
class                        score  action      seed's examples
===========================  =====  ==========  ===================================================
success                      1.0    --          cudaSuccess
transient                    0.9    throttle    launch timeout, launch out of resources
configuration / resource     0.4    isolate     memory allocation, invalid value (isolate 5 min)
hardware / driver            0.0    drain       initialization error and anything "higher"
===========================  =====  ==========  ===================================================

The seed classifies by numeric *ranges* (``code >= cudaErrorInitializationError`` means
hardware), which matches no real CUDA release: since CUDA 10.1 the enum is sparse
(``cudaErrorLaunchFailure`` is 719, ``cudaErrorLaunchTimeout`` 702), so a range test would call a
launch timeout hardware and an ECC error (214) less severe than a launch failure. This module
classifies each *named* ``cudaError_t`` value instead.

Source of names and numbers: ``enum cudaError`` in CUDA's ``driver_types.h`` (CUDA 12.x and
13.1/13.3 headers, cross-checked against the CUDA Runtime API reference "Data types used by CUDA
Runtime", group ``CUDART_TYPES``). Numbers are the current ones (CUDA >= 10.1); CUDA <= 10.0 used
a dense numbering (e.g. 4 was ``cudaErrorLaunchFailure``, now ``cudaErrorCudartUnloading``),
so integer codes from very old runtimes would be misread: send the name when you can.

How a value is classified, beyond the seed's examples (the rationale is in docs/detectors.md):

* hardware / driver (``drain``): the driver or device is unusable (no device, init failure,
  driver mismatch, uncorrectable ECC / NVLink, MPS client terminated) or the error is one CUDA
  documents as *sticky*: "this leaves the process in an inconsistent state and any further CUDA
  work will return the same error; the process must be terminated and relaunched" (illegal
  address, launch failure, device assert, illegal instruction ...). Either way every later
  request on that replica fails until someone acts, so the router must stop sending to it.
  ``cudaErrorUnknown`` (999) is here because the seed lists it here.
* transient (``throttle``): the seed's two (launch timeout, launch out of resources; note that
  CUDA documents launch timeout as sticky, the seed calls it transient and we follow the seed:
  reclassify it with the ``gpu_health.reclassify`` setting if your fleet disagrees), plus a wait
  timeout and an MPS server that is still recovering.
* configuration / resource (``isolate``): everything else that is a real error: bad arguments,
  missing kernels for the architecture, out of memory, unsupported operations, capture misuse.
* success: ``cudaSuccess`` and ``cudaErrorNotReady`` (which CUDA says "is not actually an error").
* a name or code this table does not know (a newer CUDA, a typo, a driver-API ``CUresult``) is
  classified configuration / resource (0.4, isolate): never ignored, because the request did
  fail, and never drained, because draining a fleet on a name we cannot read would turn a
  reporting change into an outage. The result says ``known=False`` so it shows in the evidence.

NVML faults arrive as XID codes and ECC counters on telemetry, see :data:`HARDWARE_XIDS`.

>>> info = classify_cuda_error("cudaErrorMemoryAllocation")
>>> info.code, str(info.error_class), CLASS_SCORE[info.error_class], CLASS_ACTION[info.error_class]
(2, 'configuration', 0.4, 'isolate')
>>> info = classify_cuda_error("719")
>>> info.name, str(info.error_class)
('cudaErrorLaunchFailure', 'hardware')
>>> CLASS_ACTION[classify_cuda_error(702).error_class]
'throttle'
>>> info = classify_cuda_error("cudaErrorFromTheFuture")
>>> str(info.error_class), info.known
('configuration', False)
>>> str(classify_xid(79)), classify_xid(13) is None
('hardware', True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class ErrorClass(StrEnum):
    """The seed's four health classes, ordered from healthy to unusable."""

    SUCCESS = "success"
    TRANSIENT = "transient"
    CONFIGURATION = "configuration"  # configuration / resource
    HARDWARE = "hardware"  # hardware / driver (or a sticky, process-fatal error)


# seed §4.3: the score of each class; the health of a replica is the minimum over active classes
CLASS_SCORE: Mapping[ErrorClass, float] = {
    ErrorClass.SUCCESS: 1.0,
    ErrorClass.TRANSIENT: 0.9,
    ErrorClass.CONFIGURATION: 0.4,
    ErrorClass.HARDWARE: 0.0,
}
# seed §4.3: what the router should do
CLASS_ACTION: Mapping[ErrorClass, str | None] = {
    ErrorClass.SUCCESS: None,
    ErrorClass.TRANSIENT: "throttle",
    ErrorClass.CONFIGURATION: "isolate",
    ErrorClass.HARDWARE: "drain",
}
# severity order, used to pick the worst of several classes
CLASS_RANK: Mapping[ErrorClass, int] = {
    ErrorClass.SUCCESS: 0,
    ErrorClass.TRANSIENT: 1,
    ErrorClass.CONFIGURATION: 2,
    ErrorClass.HARDWARE: 3,
}

_S, _T, _C, _H = ErrorClass.SUCCESS, ErrorClass.TRANSIENT, ErrorClass.CONFIGURATION, ErrorClass.HARDWARE

# enum cudaError (driver_types.h, CUDA 13.x): name -> (code, class). Deprecated values are kept:
# an old engine may still report them.
_TABLE: dict[str, tuple[int, ErrorClass]] = {
    "cudaSuccess": (0, _S),
    "cudaErrorInvalidValue": (1, _C),
    "cudaErrorMemoryAllocation": (2, _C),
    "cudaErrorInitializationError": (3, _H),
    "cudaErrorCudartUnloading": (4, _C),
    "cudaErrorProfilerDisabled": (5, _C),
    "cudaErrorProfilerNotInitialized": (6, _C),
    "cudaErrorProfilerAlreadyStarted": (7, _C),
    "cudaErrorProfilerAlreadyStopped": (8, _C),
    "cudaErrorInvalidConfiguration": (9, _C),
    "cudaErrorInvalidPitchValue": (12, _C),
    "cudaErrorInvalidSymbol": (13, _C),
    "cudaErrorInvalidHostPointer": (16, _C),
    "cudaErrorInvalidDevicePointer": (17, _C),
    "cudaErrorInvalidTexture": (18, _C),
    "cudaErrorInvalidTextureBinding": (19, _C),
    "cudaErrorInvalidChannelDescriptor": (20, _C),
    "cudaErrorInvalidMemcpyDirection": (21, _C),
    "cudaErrorAddressOfConstant": (22, _C),
    "cudaErrorTextureFetchFailed": (23, _C),
    "cudaErrorTextureNotBound": (24, _C),
    "cudaErrorSynchronizationError": (25, _C),
    "cudaErrorInvalidFilterSetting": (26, _C),
    "cudaErrorInvalidNormSetting": (27, _C),
    "cudaErrorMixedDeviceExecution": (28, _C),
    "cudaErrorNotYetImplemented": (31, _C),
    "cudaErrorMemoryValueTooLarge": (32, _C),
    "cudaErrorStubLibrary": (34, _H),  # no real driver loaded: nothing will run
    "cudaErrorInsufficientDriver": (35, _H),  # driver older than the runtime
    "cudaErrorCallRequiresNewerDriver": (36, _C),  # one API call, not the whole device
    "cudaErrorInvalidSurface": (37, _C),
    "cudaErrorDuplicateVariableName": (43, _C),
    "cudaErrorDuplicateTextureName": (44, _C),
    "cudaErrorDuplicateSurfaceName": (45, _C),
    "cudaErrorDevicesUnavailable": (46, _C),  # exclusive compute mode / memory held by others
    "cudaErrorIncompatibleDriverContext": (49, _C),
    "cudaErrorMissingConfiguration": (52, _C),
    "cudaErrorPriorLaunchFailure": (53, _C),
    "cudaErrorLaunchMaxDepthExceeded": (65, _C),
    "cudaErrorLaunchFileScopedTex": (66, _C),
    "cudaErrorLaunchFileScopedSurf": (67, _C),
    "cudaErrorSyncDepthExceeded": (68, _C),
    "cudaErrorLaunchPendingCountExceeded": (69, _C),
    "cudaErrorInvalidDeviceFunction": (98, _C),
    "cudaErrorNoDevice": (100, _H),
    "cudaErrorInvalidDevice": (101, _C),  # a bad ordinal: configuration
    "cudaErrorDeviceNotLicensed": (102, _C),
    "cudaErrorSoftwareValidityNotEstablished": (103, _H),  # runtime/driver self-test failed
    "cudaErrorStartupFailure": (127, _H),
    "cudaErrorInvalidKernelImage": (200, _C),
    "cudaErrorDeviceUninitialized": (201, _C),
    "cudaErrorMapBufferObjectFailed": (205, _C),
    "cudaErrorUnmapBufferObjectFailed": (206, _C),
    "cudaErrorArrayIsMapped": (207, _C),
    "cudaErrorAlreadyMapped": (208, _C),
    "cudaErrorNoKernelImageForDevice": (209, _C),
    "cudaErrorAlreadyAcquired": (210, _C),
    "cudaErrorNotMapped": (211, _C),
    "cudaErrorNotMappedAsArray": (212, _C),
    "cudaErrorNotMappedAsPointer": (213, _C),
    "cudaErrorECCUncorrectable": (214, _H),
    "cudaErrorUnsupportedLimit": (215, _C),
    "cudaErrorDeviceAlreadyInUse": (216, _C),
    "cudaErrorPeerAccessUnsupported": (217, _C),
    "cudaErrorInvalidPtx": (218, _C),
    "cudaErrorInvalidGraphicsContext": (219, _C),
    "cudaErrorNvlinkUncorrectable": (220, _H),
    "cudaErrorJitCompilerNotFound": (221, _C),
    "cudaErrorUnsupportedPtxVersion": (222, _C),
    "cudaErrorJitCompilationDisabled": (223, _C),
    "cudaErrorUnsupportedExecAffinity": (224, _C),
    "cudaErrorUnsupportedDevSideSync": (225, _C),
    "cudaErrorContained": (226, _H),  # a device exception contained by the GPU's error containment
    "cudaErrorInvalidSource": (300, _C),
    "cudaErrorFileNotFound": (301, _C),
    "cudaErrorSharedObjectSymbolNotFound": (302, _C),
    "cudaErrorSharedObjectInitFailed": (303, _C),
    "cudaErrorOperatingSystem": (304, _C),
    "cudaErrorInvalidResourceHandle": (400, _C),
    "cudaErrorIllegalState": (401, _C),
    "cudaErrorLossyQuery": (402, _C),
    "cudaErrorSymbolNotFound": (500, _C),
    "cudaErrorNotReady": (600, _S),  # CUDA: "not actually an error"
    "cudaErrorIllegalAddress": (700, _H),  # sticky
    "cudaErrorLaunchOutOfResources": (701, _T),  # seed: transient
    "cudaErrorLaunchTimeout": (702, _T),  # seed: transient (CUDA documents it as sticky)
    "cudaErrorLaunchIncompatibleTexturing": (703, _C),
    "cudaErrorPeerAccessAlreadyEnabled": (704, _C),
    "cudaErrorPeerAccessNotEnabled": (705, _C),
    "cudaErrorSetOnActiveProcess": (708, _C),
    "cudaErrorContextIsDestroyed": (709, _C),
    "cudaErrorAssert": (710, _H),  # sticky: "the device cannot be used again"
    "cudaErrorTooManyPeers": (711, _C),
    "cudaErrorHostMemoryAlreadyRegistered": (712, _C),
    "cudaErrorHostMemoryNotRegistered": (713, _C),
    "cudaErrorHardwareStackError": (714, _H),  # sticky
    "cudaErrorIllegalInstruction": (715, _H),  # sticky
    "cudaErrorMisalignedAddress": (716, _H),  # sticky
    "cudaErrorInvalidAddressSpace": (717, _H),  # sticky
    "cudaErrorInvalidPc": (718, _H),  # sticky
    "cudaErrorLaunchFailure": (719, _H),  # sticky
    "cudaErrorCooperativeLaunchTooLarge": (720, _C),
    "cudaErrorTensorMemoryLeak": (721, _C),
    "cudaErrorNotPermitted": (800, _C),
    "cudaErrorNotSupported": (801, _C),
    "cudaErrorSystemNotReady": (802, _H),  # driver daemons not running
    "cudaErrorSystemDriverMismatch": (803, _H),
    "cudaErrorCompatNotSupportedOnDevice": (804, _H),
    "cudaErrorMpsConnectionFailed": (805, _H),
    "cudaErrorMpsRpcFailure": (806, _H),
    "cudaErrorMpsServerNotReady": (807, _T),  # MPS server recovering
    "cudaErrorMpsMaxClientsReached": (808, _C),
    "cudaErrorMpsMaxConnectionsReached": (809, _C),
    "cudaErrorMpsClientTerminated": (810, _H),  # process must be relaunched
    "cudaErrorCdpNotSupported": (811, _C),
    "cudaErrorCdpVersionMismatch": (812, _C),
    "cudaErrorStreamCaptureUnsupported": (900, _C),
    "cudaErrorStreamCaptureInvalidated": (901, _C),
    "cudaErrorStreamCaptureMerge": (902, _C),
    "cudaErrorStreamCaptureUnmatched": (903, _C),
    "cudaErrorStreamCaptureUnjoined": (904, _C),
    "cudaErrorStreamCaptureIsolation": (905, _C),
    "cudaErrorStreamCaptureImplicit": (906, _C),
    "cudaErrorCapturedEvent": (907, _C),
    "cudaErrorStreamCaptureWrongThread": (908, _C),
    "cudaErrorTimeout": (909, _T),  # a wait timed out
    "cudaErrorGraphExecUpdateFailure": (910, _C),
    "cudaErrorExternalDevice": (911, _H),  # sticky
    "cudaErrorInvalidClusterSize": (912, _C),
    "cudaErrorFunctionNotLoaded": (913, _C),
    "cudaErrorInvalidResourceType": (914, _C),
    "cudaErrorInvalidResourceConfiguration": (915, _C),
    "cudaErrorStreamDetached": (917, _C),
    "cudaErrorGraphRecaptureFailure": (918, _C),
    "cudaErrorUnknown": (999, _H),  # seed lists it under hardware / driver
    "cudaErrorApiFailureBase": (10000, _C),
}

CUDA_ERROR_CODES: Mapping[str, int] = {name: code for name, (code, _) in _TABLE.items()}
CUDA_ERROR_NAMES: Mapping[int, str] = {code: name for name, (code, _) in _TABLE.items()}
CUDA_ERROR_CLASSES: Mapping[str, ErrorClass] = {name: cls for name, (_, cls) in _TABLE.items()}
_BY_LOWER: dict[str, str] = {name.lower(): name for name in _TABLE}
_BY_LOWER.update({name.lower().removeprefix("cudaerror"): name for name in _TABLE if name != "cudaSuccess"})

UNKNOWN_CLASS = ErrorClass.CONFIGURATION  # see the module docstring: never ignored, never drained

# NVML XID codes that mean the GPU itself needs draining (NVIDIA Xid catalog, "Analyzing Xid
# Errors", and DCGM's health checks): 48 double-bit ECC; 64 ECC page-retirement / row-remap
# failure; 74 NVLink error; 79 GPU fallen off the bus; 94 contained and 95 uncontained ECC
# error; 119 GSP RPC timeout; 120 GSP error; 140 unrecovered ECC error. Application-caused XIDs
# (13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive
# cleanup) follow a buggy job and are reported on requests as CUDA errors; 63 (row remapping
# recorded) and 92 (high single-bit ECC rate) are warnings: these are evidence only.
HARDWARE_XIDS: frozenset[int] = frozenset({48, 64, 74, 79, 94, 95, 119, 120, 140})


@dataclass(frozen=True, slots=True)
class CudaErrorInfo:
    """What one reported ``cuda_error`` value means."""

    name: str | None  # canonical cudaError_t name, or the value as sent when unknown
    code: int | None  # numeric cudaError_t value, None when unknown
    error_class: ErrorClass
    known: bool  # False: not in the table, classified conservatively (UNKNOWN_CLASS)


def classify_cuda_error(value: str | int | None, reclassify: Mapping[str, ErrorClass] | None = None) -> CudaErrorInfo:
    """Classify a ``cuda_error`` as sent on a request event: a name, an integer, or its string.

    Names match case-insensitively, with or without the ``cudaError`` prefix. ``None``, ``""``
    and ``0`` are success. ``reclassify`` maps canonical names to another class (operator
    override, e.g. ``{"cudaErrorLaunchTimeout": ErrorClass.HARDWARE}``).

    >>> str(classify_cuda_error(None).error_class)
    'success'
    >>> classify_cuda_error("illegaladdress").name
    'cudaErrorIllegalAddress'
    >>> classify_cuda_error(4242).known
    False
    """
    if value is None:
        return CudaErrorInfo("cudaSuccess", 0, ErrorClass.SUCCESS, True)
    name: str | None
    if isinstance(value, bool):  # bool is an int subclass; a bool here is a malformed report
        return CudaErrorInfo(str(value), None, UNKNOWN_CLASS, False)
    if isinstance(value, int):
        code: int | None = value
        name = CUDA_ERROR_NAMES.get(value)
    else:
        text = value.strip()
        if text == "":
            return CudaErrorInfo("cudaSuccess", 0, ErrorClass.SUCCESS, True)
        try:
            code = int(text)
            name = CUDA_ERROR_NAMES.get(code)
        except ValueError:
            name = _BY_LOWER.get(text.lower())
            code = CUDA_ERROR_CODES[name] if name is not None else None
            if name is None:
                return CudaErrorInfo(text, None, UNKNOWN_CLASS, False)
    if name is None:
        return CudaErrorInfo(None, code, UNKNOWN_CLASS, False)
    error_class = CUDA_ERROR_CLASSES[name]
    if reclassify and name in reclassify:
        error_class = reclassify[name]
    return CudaErrorInfo(name, code, error_class, True)


def classify_xid(xid: int | None, hardware_xids: frozenset[int] = HARDWARE_XIDS) -> ErrorClass | None:
    """``HARDWARE`` for an XID that needs a drain, ``None`` (evidence only) otherwise."""
    if xid is None:
        return None
    return ErrorClass.HARDWARE if xid in hardware_xids else None


def canonical_name(name: str) -> str | None:
    """The table's spelling of a cudaError_t name (case-insensitive, prefix optional), or None."""
    return _BY_LOWER.get(name.strip().lower())
