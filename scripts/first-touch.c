// first-touch: the kernel's copy into fresh pages three times, then
// memcpy into the same pages three times, then memcpy into fresh pages:
// shows what a page's first touch from user space costs after the kernel
// wrote it. docs/performance.md, "Blocks above 16 MiB, again".
//
//   gcc -O2 -o /tmp/first-touch scripts/first-touch.c && /tmp/first-touch 67108864
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static char* fresh(size_t n,int touch){ char*b=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); if(touch) memset(b,3,n); return b;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]);
  int p[2],q[2]; pipe(p); pipe(q);
  pid_t c=fork();
  if(c==0){ char *src=fresh(n,1); write(p[1],&src,sizeof src); char x; read(q[0],&x,1); return 0; }
  char *src; read(p[0],&src,sizeof src);
  char *dst=fresh(n,0), *tmp=fresh(n,1);
  for(int r=0;r<3;r++){ struct iovec l={dst,n},rr={src,n}; double a=now(); process_vm_readv(c,&l,1,&rr,1,0); printf("readv into dst %d: %.0f us\n",r,now()-a);} 
  for(int r=0;r<3;r++){ double a=now(); memcpy(dst,tmp,n); printf("user memcpy into dst %d: %.0f us\n",r,now()-a);} 
  char *d2=fresh(n,0);
  for(int r=0;r<3;r++){ double a=now(); memcpy(d2,tmp,n); printf("user memcpy into fresh d2 %d: %.0f us\n",r,now()-a);} 
  write(q[1],"x",1); wait(0); return 0;
}
