#pragma once

// libddp: distributed data-parallel training for LibTorch.
#include <ddp/communicator.h>
#include <ddp/environment.h>
#include <ddp/errors.h>
#include <ddp/process_group.h>
