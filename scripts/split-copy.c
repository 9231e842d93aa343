// split-copy: how fast N bytes move from a parent's buffer into a child's
// by the kernel's single copy, on one core (the child's process_vm_readv
// of all of it: split 0) or on both (the child reads the first half while
// the parent writes the second with process_vm_writev: split 1), in
// pieces of P bytes; best and median of 40. docs/performance.md, "The
// kernel's copy on both cores".
//
//   gcc -O2 -o /tmp/split-copy scripts/split-copy.c && /tmp/split-copy 1048576 1048576 1
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <stdatomic.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
// shared control
struct ctl { atomic_int go; atomic_int done; char *dst; };
int main(int argc,char**argv){
  if(argc<4){fprintf(stderr,"usage: split-copy N PIECE SPLIT(0|1)\n");return 2;}
  size_t n=atol(argv[1]); size_t piece=atol(argv[2]); int split=atoi(argv[3]);
  int R=40;
  struct ctl *c=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char *src=malloc(n); memset(src,1,n);
  pid_t parent=getpid();
  pid_t ch=fork();
  if(ch==0){
    char *dst=malloc(n); memset(dst,0,n); c->dst=dst;
    atomic_store(&c->done,-1);
    for(int r=0;r<R;r++){
      while(atomic_load(&c->go)!=r+1);
      size_t end = split? n/2 : n;
      for(size_t o=0;o<end;o+=piece){ size_t k=piece<end-o?piece:end-o; struct iovec l={dst+o,k},rr={src+o,k}; if(process_vm_readv(parent,&l,1,&rr,1,0)!=(ssize_t)k){perror("readv");_exit(1);} }
      atomic_fetch_add(&c->done,1);
    }
    usleep(100000); _exit(0);
  }
  while(atomic_load(&c->done)!=-1);
  atomic_store(&c->done,0);
  double t[64];
  for(int r=0;r<R;r++){
    double a=now();
    atomic_store(&c->go,r+1);
    if(split){
      for(size_t o=n/2;o<n;o+=piece){ size_t k=piece<n-o?piece:n-o; struct iovec l={src+o,k},rr={c->dst+o,k}; if(process_vm_writev(ch,&l,1,&rr,1,0)!=(ssize_t)k){perror("writev");return 1;} }
    }
    while(atomic_load(&c->done)!=r+1);
    t[r]=now()-a;
  }
  qsort(t,R,sizeof(double),cmp);
  printf("n=%zu piece=%zu split=%d best %.0f median %.0f us (%.2f GB/s median)\n",n,piece,split,t[0],t[R/2], n/t[R/2]/1e3);
  waitpid(ch,0,0); return 0;
}
