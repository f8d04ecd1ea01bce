#pragma once
#include "cuda_runtime.h"
struct __half { unsigned short v; };
struct __half2 { __half x, y; };
float __half2float(__half);
__half __float2half_rn(float);
float2 __half22float2(__half2);
