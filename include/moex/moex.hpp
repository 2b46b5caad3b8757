// moex/moex.hpp — everything of the public API.
#pragma once
#include "moex/backend.hpp"
#include "moex/device.hpp"
#include "moex/dtype.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/routing.hpp"
#include "moex/tensor.hpp"
