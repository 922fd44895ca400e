#pragma once

// libddp: distributed data-parallel training for LibTorch.
#include <ddp/batch_norm.h>
#include <ddp/captured_step.h>
#include <ddp/checkpoint.h>
#include <ddp/comm_hooks.h>
#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/environment.h>
#include <ddp/errors.h>
#include <ddp/float8.h>
#include <ddp/float8_tensor.h>
#include <ddp/grad_scaler.h>
#include <ddp/iteration_timing.h>
#include <ddp/join.h>
#include <ddp/optim.h>
#include <ddp/precision.h>
#include <ddp/process_group.h>
#include <ddp/rms_norm.h>
#include <ddp/sharding.h>
#include <ddp/sync_batch_norm.h>
#include <ddp/versions.h>
