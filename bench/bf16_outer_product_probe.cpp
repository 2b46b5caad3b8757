// bench/bf16_outer_product_probe.cpp — how far moex's vdpbf16ps dot-product form (4 activation rows ×
// 4 weight rows, vector partial sums along k, horizontal sums at the end; kernels_avx512bf16.cpp) is
// from the instruction's peak, against an outer-product form on weights packed in the VNNI pair
// layout ([k/2][32 columns][2] per 32-column panel: each 64-byte load holds 16 columns × 2 k, the
// activations' k pairs broadcast, 12 rows × 2 vectors of accumulators). A standalone probe (not part
// of the build), one thread, operands in cache (X 256 × 1024, W 1024 × 1024, bf16), checked against an
// f64 sum. Run on the development machine (2026-12-01, docs/PERF.md):
//   g++ -O3 -march=native bench/bf16_outer_product_probe.cpp -o /tmp/bf16_op && /tmp/bf16_op
// prints GFLOP/s of both forms; the probe in `moex bench` gives the peak (one core: ~230 GFLOP/s there).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <cmath>
static uint16_t f2b(float f){uint32_t u; memcpy(&u,&f,4); return uint16_t((u + 0x7fff + ((u>>16)&1))>>16);}
static float b2f(uint16_t b){uint32_t u=uint32_t(b)<<16; float f; memcpy(&f,&u,4); return f;}
template<int MR>
static void kern(const uint16_t* x, int64_t ldx, const uint16_t* wp /*[k/2][32][2]*/, int64_t k, float* y, int64_t ldy){
  __m512 acc[MR][2];
  for(int r=0;r<MR;++r){acc[r][0]=_mm512_setzero_ps(); acc[r][1]=_mm512_setzero_ps();}
  for(int64_t kp=0; kp<k/2; ++kp){
    const __m512i w0=_mm512_loadu_si512(wp + kp*64), w1=_mm512_loadu_si512(wp + kp*64 + 32);
#pragma GCC unroll 16
    for(int r=0;r<MR;++r){
      const __m512i xb=_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + r*ldx + 2*kp));
      acc[r][0]=_mm512_dpbf16_ps(acc[r][0],(__m512bh)xb,(__m512bh)w0);
      acc[r][1]=_mm512_dpbf16_ps(acc[r][1],(__m512bh)xb,(__m512bh)w1);
    }
  }
  for(int r=0;r<MR;++r){_mm512_storeu_ps(y+r*ldy,acc[r][0]); _mm512_storeu_ps(y+r*ldy+16,acc[r][1]);}
}

template<int MR,int NR>
static void dotk(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t k, float* y, int64_t ldy){
  __m512 acc[MR][NR];
  for(int r=0;r<MR;++r) for(int c=0;c<NR;++c) acc[r][c]=_mm512_setzero_ps();
  for(int64_t kk=0; kk<k; kk+=32){
    __m512i xv[MR]; for(int r=0;r<MR;++r) xv[r]=_mm512_loadu_si512(x+r*ldx+kk);
    for(int c=0;c<NR;++c){ const __m512i wv=_mm512_loadu_si512(w+c*ldw+kk); for(int r=0;r<MR;++r) acc[r][c]=_mm512_dpbf16_ps(acc[r][c],(__m512bh)xv[r],(__m512bh)wv);}
  }
  for(int r=0;r<MR;++r) for(int c=0;c<NR;++c) y[r*ldy+c]=_mm512_reduce_add_ps(acc[r][c]);
}
int main(){
  const int64_t m=256, k=1024, N=1024;
  std::vector<uint16_t> x(m*k), w(N*k), wp(N*k);
  for(int64_t i=0;i<m*k;++i) x[i]=f2b(std::sin(i*0.37f));
  for(int64_t i=0;i<N*k;++i) w[i]=f2b(std::cos(i*0.11f));
  // pack: panel p (32 cols) : [k/2][32][2]
  for(int64_t p=0;p<N/32;++p) for(int64_t kp=0;kp<k/2;++kp) for(int c=0;c<32;++c) for(int j=0;j<2;++j)
    wp[p*k*32 + kp*64 + c*2 + j] = w[(p*32+c)*k + 2*kp + j];
  std::vector<float> y(m*N);
  constexpr int MR=12;
  auto run=[&]{
    for(int64_t p=0;p<N/32;++p){
      int64_t i=0;
      for(; i+MR<=m; i+=MR) kern<MR>(x.data()+i*k, k, wp.data()+p*k*32, k, y.data()+i*N+p*32, N);
      for(; i+4<=m; i+=4) kern<4>(x.data()+i*k, k, wp.data()+p*k*32, k, y.data()+i*N+p*32, N);
      for(; i<m; ++i) kern<1>(x.data()+i*k, k, wp.data()+p*k*32, k, y.data()+i*N+p*32, N);
    }
  };
  run();
  // check a few
  double maxe=0; for(int t=0;t<50;++t){int64_t i=(t*37)%m, n=(t*101)%N; double s=0; for(int64_t q=0;q<k;++q) s+=double(b2f(x[i*k+q]))*b2f(w[n*k+q]); maxe=std::max(maxe,std::fabs(s-y[i*N+n])/(std::fabs(s)+1));}
  auto t0=std::chrono::steady_clock::now(); int reps=50; for(int r=0;r<reps;++r) run();
  double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  auto rund=[&]{ for(int64_t n=0;n<N;n+=4) for(int64_t i=0;i<m;i+=4) dotk<4,4>(x.data()+i*k,k,w.data()+n*k,k,k,y.data()+i*N+n,N); };
  rund(); auto t1=std::chrono::steady_clock::now(); for(int r=0;r<reps;++r) rund();
  double s2=std::chrono::duration<double>(std::chrono::steady_clock::now()-t1).count();
  printf("dot 4x4 (moex's form): %.1f GFLOP/s one thread\n", 2.0*m*k*N*reps/s2/1e9);
  printf("outer-product MR=%d: %.1f GFLOP/s one thread, max rel err %.2e\n", MR, 2.0*m*k*N*reps/s/1e9, maxe);
}
