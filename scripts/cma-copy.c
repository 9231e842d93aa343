// cma-copy: how fast the kernel's single copy (process_vm_readv) moves N
// bytes from a child's memory, in pieces of P bytes (0: memcpy in this
// process instead), best and median of 60. docs/performance.md, "What the
// kernel's copy costs here".
//
//   gcc -O2 -o /tmp/cma-copy scripts/cma-copy.c && /tmp/cma-copy 16777216 1048576
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>
#include <signal.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); size_t piece=atol(argv[2]);
  char *src=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(src,1,n);
  int p[2]; pipe(p);
  pid_t c=fork();
  if(c==0){ char *own=malloc(n); memset(own,2,n); write(p[1],&own,sizeof own); pause(); return 0;}
  char *remote; read(p[0],&remote,sizeof remote);
  char *dst=malloc(n); memset(dst,0,n);
  double t[60];
  for(int r=0;r<60;r++){
    double a=now();
    if(piece==0){ memcpy(dst,src,n);} else
    for(size_t o=0;o<n;o+=piece){ struct iovec l={dst+o,piece},rr={remote+o,piece}; if(process_vm_readv(c,&l,1,&rr,1,0)!=(ssize_t)piece){perror("readv");return 1;} }
    t[r]=now()-a;
  }
  qsort(t,60,sizeof(double),cmp);
  printf("n=%zu piece=%zu best %.0f median %.0f us\n",n,piece,t[0],t[30]);
  kill(c,9); return 0;
}
