#pragma once

// libddp: distributed data-parallel training for LibTorch.
#include <ddp/comm_hooks.h>
#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/environment.h>
#include <ddp/errors.h>
#include <ddp/process_group.h>
