/* A C program built with `pkg-config cachegen-core`: the C API round trip. */
#include <cachegen/cachegen.h>
#include <math.h>
#include <stdio.h>

int main(void) {
  enum { L = 2, H = 2, D = 64, T = 64 };
  static float in[L * 2 * T * H * D], out[L * 2 * T * H * D];
  for (int i = 0; i < L * 2 * T * H * D; ++i) in[i] = (float)sin(0.37 * i);
  cg_config cfg;
  cg_config_default(&cfg);
  uint8_t* buf = NULL;
  size_t len = 0;
  char err[256];
  if (cg_encode(in, CG_F32, L, H, D, T, &cfg, &buf, &len, err, sizeof err) != CG_OK) {
    fprintf(stderr, "encode: %s\n", err);
    return 1;
  }
  if (cg_decode(buf, len, 0, CG_F32, out, sizeof out, 0, err, sizeof err) != CG_OK) {
    fprintf(stderr, "decode: %s\n", err);
    return 1;
  }
  cg_free(buf);
  printf("c consumer ok: cachegen %s, %zu bytes\n", cg_version(), len);
  return 0;
}
